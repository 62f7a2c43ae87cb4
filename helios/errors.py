"""One exception hierarchy; every message says what was wrong."""


class HeliosError(Exception):
    """Base class of every error Helios raises."""


class ConfigError(HeliosError, ValueError):
    """An invalid configuration value; the message names the field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):
        # Rebuilt from its two fields: a worker process's error then reaches the parent intact
        # instead of breaking the process pool when the default (one-argument) unpickling fails.
        return type(self), (self.field, self.message)


class UnknownRequest(HeliosError, KeyError):
    """A handle that the scheduler does not know (never admitted, or already retired)."""

    def __str__(self) -> str:  # KeyError quotes its argument otherwise
        return str(self.args[0]) if self.args else "unknown request"


class StalePlan(HeliosError):
    """A plan whose requests, epochs, resources or freshness changed since it was made."""


class QueueFull(HeliosError):
    """Commit while the execution window has no room or needs feedback first."""


class InvalidCompletion(HeliosError):
    """A completion that does not match its fence; nothing was changed."""


class ResourceExhausted(HeliosError):
    """Not enough request slots or KV pages for the requested work."""


class InvalidRequest(HeliosError, ValueError):
    """A request specification that cannot be served."""
