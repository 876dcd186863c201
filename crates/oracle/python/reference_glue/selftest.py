"""Oracle self-tests (crates/oracle/tests): the transfer and tracebacks."""


def echo(value):
    """Returns its argument unchanged (round-trip test of the transfer)."""
    return value


def raise_value_error(message):
    """Raises ValueError(message): errors surface with traceback and case."""
    raise ValueError(message)
