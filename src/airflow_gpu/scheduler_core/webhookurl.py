"""Webhook URLs: checked with the parser the sender uses (httpx.URL), so that a URL the
service accepts is one it can POST to; and shown redacted to those who may not see its
path and query (Slack-style URLs carry their secret there)."""

from __future__ import annotations

import re

import httpx

FIX = ("write it as http(s)://host[:port]/path, with a numeric port and no spaces, tabs, "
       "line breaks or other control characters")
HIDDEN = "…"            # stands for a path and query that are not shown


def _quoted(v: str) -> str:
    """`v` as messages quote it: repr (control characters escaped), cut at 200."""
    return repr(v if len(v) <= 200 else v[:200] + "...")


class BadURL(ValueError):
    """A URL the sender cannot POST to: `why` says what is wrong without the URL."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def parse(v: str) -> httpx.URL:
    """`v` parsed as the sender parses it: an http(s) URL with a host, a port from 1 to
    65535 if any, and no user:password part. BadURL: what is wrong and the fix."""
    if not isinstance(v, str):
        raise BadURL(f"{v!r} is not text; {FIX}", "is not text")
    try:
        url = httpx.URL(v)
    except (httpx.InvalidURL, ValueError) as exc:
        why = _printable(str(exc)).rstrip(".")
        why = f"cannot be sent to ({why[:1].lower() + why[1:]})"
        raise BadURL(f"{_quoted(v)} {why}; {FIX}", why) from None
    if url.scheme not in ("http", "https") or not url.raw_host:
        why = "is not an http:// or https:// URL with a host"
        raise BadURL(f"{_quoted(v)} {why}; {FIX}", why)
    host = url.raw_host.decode("ascii", "replace")
    if url.userinfo:
        why = "has a user or password part"
        raise BadURL(f"{url.scheme}://...@{host}: a URL with a user or password part is "
                     "refused (URLs are shown to teams); let the receiver check the "
                     "signature instead", why)
    if "%" in host or not re.fullmatch(r"[A-Za-z0-9._~:-]+", host):
        why = f"has no valid host ({host!r} is not a host name or address)"
        raise BadURL(f"{_quoted(v)} {why}; {FIX}", why)
    if url.port is not None and not 1 <= url.port <= 65535:
        why = f"has port {url.port}, not one from 1 to 65535"
        raise BadURL(f"{_quoted(v)} {why}; {FIX}", why)
    return url


def web_url(v: str) -> str:
    """`v` unchanged once parse() takes it (what is stored and signed is what was given)."""
    parse(v)
    return v


def redact(url: str) -> str:
    """scheme://host[:port]/… : the URL without its path and query (nor any user part);
    whole where it has neither. Never a control character, also for a URL stored before
    URLs were checked."""
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii", "replace")
        base = f"{parsed.scheme}://{f'[{host}]' if ':' in host else host}" + (
            f":{parsed.port}" if parsed.port is not None else "")
        rest = parsed.raw_path.decode("ascii", "replace")     # the path and query
        return base + ("/" if rest == "/" else "/" + HIDDEN)
    except (httpx.InvalidURL, ValueError, UnicodeError):
        found = re.match(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)", url)
        if found is None:
            return HIDDEN
        scheme, netloc = found.groups()
        base = scheme + netloc.rsplit("@", 1)[-1]
        base = _printable(base)[:200]
        return base + ("" if found.end() == len(url) else "/" + HIDDEN)


def shown(url: str | None, owner: str, viewer) -> str | None:
    """`url` of team `owner`'s as `viewer` (a Principal; None: the service itself) may
    see it: whole for the owner team and admins, else redacted."""
    if url is None or viewer is None or viewer.may_act_for(owner):
        return url
    return redact(url)
