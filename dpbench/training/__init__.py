"""Lightning pieces: the DP module, the data module, and the callbacks around them."""
