"""API errors as the real server reports them: an HTTP code plus a ``Status`` object."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call; ``status()`` is the ``meta/v1 Status`` body the server sends."""

    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details or {}

    def status(self) -> dict[str, Any]:
        """The ``Status`` object for this error."""
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    @staticmethod
    def _details(resource: str, group: str, name: str) -> dict[str, Any]:
        return {"name": name, "group": group, "kind": resource}

    @classmethod
    def not_found(cls, resource: str, group: str, name: str) -> ApiError:
        """404 for a named object."""
        what = f"{resource}.{group}" if group else resource
        return cls(404, "NotFound", f'{what} "{name}" not found',
                   cls._details(resource, group, name))

    @classmethod
    def not_found_path(cls, message: str) -> ApiError:
        """404 for a path the server does not serve."""
        return cls(404, "NotFound", message)

    @classmethod
    def already_exists(cls, resource: str, group: str, name: str) -> ApiError:
        """409 on create of an existing name."""
        what = f"{resource}.{group}" if group else resource
        return cls(409, "AlreadyExists", f'{what} "{name}" already exists',
                   cls._details(resource, group, name))

    @classmethod
    def conflict(cls, resource: str, group: str, name: str) -> ApiError:
        """409 on a stale resourceVersion."""
        what = f"{resource}.{group}" if group else resource
        return cls(409, "Conflict",
                   f'Operation cannot be fulfilled on {what} "{name}": the object has been '
                   "modified; please apply your changes to the latest version and try again",
                   cls._details(resource, group, name))

    @classmethod
    def invalid(cls, message: str, kind: str = "", group: str = "", name: str = "",
                causes: list[dict[str, str]] | None = None) -> ApiError:
        """422 from validation or admission; ``causes`` name the fields, as
        apimachinery's ``errors.NewInvalid`` does (details carry the Kind, not the resource),
        and are what kubectl prints after "The <Kind> "<name>" is invalid"."""
        details = cls._details(kind, group, name) if kind else {}
        if causes:
            details["causes"] = causes
        return cls(422, "Invalid", message, details or None)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        """400 for a body or query the server cannot use."""
        return cls(400, "BadRequest", message)

    @classmethod
    def gone(cls, message: str) -> ApiError:
        """410 for a watch from a compacted resourceVersion."""
        return cls(410, "Expired", message)
