"""JL's forward-mode (jvp) rules: exact tangents of the layers its graph-free passes run, r directions at once."""
