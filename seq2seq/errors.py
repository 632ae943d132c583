"""The one exception type for bad input that a user can fix."""


class UserError(Exception):
    """Bad input (a file, a line, a flag). Scripts print its message on one line and exit with status 2."""


class TrainingDiverged(Exception):
    """The loss or its gradients became NaN or infinite. Scripts print the message on one line and exit
    with status 3 (not 2: the input was fine, the optimisation was not)."""
