"""`python -m dpbench.profile` is now `python -m dpbench.capacity` (a module named profile shadowed the
standard library's); this alias stays for one release (0.2 removes it)."""

import warnings

from dpbench.capacity import main

__all__ = ["main"]

if __name__ == "__main__":
    warnings.warn("python -m dpbench.profile is now python -m dpbench.capacity; 0.2 removes the old name",
                  FutureWarning, stacklevel=1)
    main()
