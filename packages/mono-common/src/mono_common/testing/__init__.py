"""Test support shared by the mono packages: the pytest plugin lives in `pytest_plugin`."""
