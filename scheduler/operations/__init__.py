"""Operations: every transition written once, sans-I/O, as requests a driver runs."""
