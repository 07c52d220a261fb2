"""The version of dataflow (its own module: code inside the package records it without importing the package face)."""

__version__ = "0.1.0"
