"""One module per CLI command, so importing the CLI stays cheap."""
