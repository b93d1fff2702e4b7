"""One module (or package) per CLI command's logic; sdbench.cli parses options and renders."""
