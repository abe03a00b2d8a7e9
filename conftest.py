"""Loaded for every test pytest collects here (tests/, and the examples of docs/ and README.md).

`tests.cwd_guard`: each test runs in its own temporary folder, and a test that writes into the folder pytest was
started from fails (the README's `dfl run` leaves `runs/` there before the README's test command runs).
"""

pytest_plugins = ["tests.cwd_guard"]
