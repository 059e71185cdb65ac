"""Counts in messages read as English: "1 run", "2 runs"."""


def counted(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
