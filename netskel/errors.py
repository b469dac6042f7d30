"""Domain errors. Servers map them to gRPC status codes; the CLI prints them
as one line. Anything else escaping is a bug."""


class NetskelError(Exception):
    """Base of the errors a user can cause and fix."""


class InputError(NetskelError):
    """A file or message does not follow its contract."""


class InsufficientData(InputError):
    """A file follows its contract but holds too little of one thing to
    answer from (an endpoint without samples, recordings that do not
    overlap). Batch commands answer the rest and say what they could not."""


class OutputError(NetskelError):
    """An output the user named cannot be written there (no such
    directory, a directory or a file in the way, a full disk, a state
    file that is no SQLite database)."""


class NotFoundError(NetskelError):
    """An id names nothing we know."""


class UnavailableError(NetskelError):
    """A service this one depends on cannot be reached now; retry later."""
