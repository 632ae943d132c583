"""The one exception type for bad input that a user can fix."""


class UserError(Exception):
    """Bad input (a file, a line, a flag). Scripts print its message on one line and exit with status 2."""
