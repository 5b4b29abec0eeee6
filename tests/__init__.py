"""The test suite: a package, so its shared helpers import as ``tests.factories``, ``tests.strategies``, ..."""
