"""`python -m dpbench.privacy.jl_curve` is now `python -m dpbench.jl_curve` (a command beside the others, not in the
privacy library); this alias stays for one release (0.2 removes it)."""

import runpy
import warnings

if __name__ == "__main__":
    warnings.warn("python -m dpbench.privacy.jl_curve is now python -m dpbench.jl_curve; 0.2 removes the old name",
                  FutureWarning, stacklevel=1)
    runpy.run_module("dpbench.jl_curve", run_name="__main__", alter_sys=True)
