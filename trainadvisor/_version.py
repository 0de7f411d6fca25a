"""The package's version, in one place (the command line's --version, analyze's Ray workers' check).

May import: nothing of the package."""

__version__ = "0.1.0"
