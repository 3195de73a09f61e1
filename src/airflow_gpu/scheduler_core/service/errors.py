"""The domain's errors; the API maps each to its HTTP status once, at the boundary."""


class NotFound(LookupError):
    pass


class Forbidden(PermissionError):
    pass


class Conflict(RuntimeError):
    pass
