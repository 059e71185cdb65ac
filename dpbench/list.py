"""`python -m dpbench.list` is now `python -m dpbench.components` (a module named list shadowed the builtin);
this alias stays for one release (0.2 removes it)."""

import warnings

from dpbench.components import main

__all__ = ["main"]

if __name__ == "__main__":
    warnings.warn("python -m dpbench.list is now python -m dpbench.components; 0.2 removes the old name", FutureWarning,
                  stacklevel=1)
    main()
