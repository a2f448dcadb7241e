"""The tests are a package: their modules import each other by relative imports."""
