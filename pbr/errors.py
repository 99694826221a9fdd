"""Errors a user can fix. The CLI prints their message as one line, never a traceback."""


class UserError(Exception):
    """Bad input (a parameter, a file, a folder): the message says what and how to fix it."""


class DataError(UserError):
    """Raw data or prepared shards are missing, truncated or not what they claim to be."""
