"""The `scheduler` command: `main` in cli.main, one module per command group, and the demo."""
