"""Teams: their shares, quotas and use; admins set them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from .. import shown
from ..bodies import DecodedOffLoop
from ..deps import Svc, Who
from ..models.base import NAME
from ..models.teams import TeamOut, TeamRequest

router = APIRouter(route_class=DecodedOffLoop)


@router.get("/api/v1/teams", response_model=list[TeamOut])
def teams(p: Who, service: Svc):
    """Every team; another team's webhook URL without its path and query (shown.py)."""
    return shown.teams(list(service.teams().values()), p)


@router.put("/api/v1/teams/{name}", response_model=TeamOut)
def set_team(name: Annotated[str, Path(pattern=NAME, max_length=200)],
             body: TeamRequest, p: Who, service: Svc):
    """Admins set a team's share, quota and borrowing (sent together: what is left out is
    cleared), and its webhook (only the webhook fields sent change)."""
    shares, webhook = body.changes()
    return service.set_team(name, p, body.share, body.quota_gpus, body.borrow_gpus,
                            webhook, shares)
