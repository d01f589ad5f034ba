"""One driver module per system; see bench/README.md for the protocol."""
