"""The agents' management API (admin key): list, show, create, edit, delete.

- ``GET /v1/agents``: ``{"default": {...}, "data": [...]}``; the default agent (the config's keys) is
  shown and never edited here (edit config.yaml).
- ``GET /v1/agents/{name}``; ``POST /v1/agents`` (fields left out take the default agent's values; the
  LLM key defaults to ``config``, the config's own key); ``PATCH /v1/agents/{name}`` (the fields to change,
  and ``version``: refused with 409 when the agent changed since it was read); ``DELETE /v1/agents/{name}``
  (its devices talk with the default agent from their next turn).

Every change applies from the next turn of each device bound to the agent, on every gateway of the store.
LLM keys are never shown back in full (``****`` and the last four characters); a masked key sent back
unchanged keeps the stored key. A voice must be one the engine offers, an MCP server one configured.
Bad input: 400 with the field at fault; the store down: 503.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Request, Response
from pydantic import ValidationError

from gateway.agents.active import Agents
from gateway.agents.profile import DEFAULT_AGENT, AgentProfile, keep_masked_key
from gateway.agents.store import AgentExists, AgentNotFound, StoredAgent, TooManyAgents, VersionConflict
from gateway.api.auth import require_admin
from gateway.api.devices import store_error
from gateway.api.errors import ApiError, ApiRoute, validation_message
from gateway.services import Services
from gateway.store import StoreError

router = APIRouter(route_class=ApiRoute, dependencies=[Depends(require_admin)], tags=["agents"])
log = logging.getLogger(__name__)

Name = Annotated[str, Path(min_length=1, max_length=48)]
MAX_BODY_KEYS = 32


def _agents(request: Request) -> tuple[Services, Agents]:
    services: Services = request.app.state.services
    if services.agents is None:
        raise ApiError(503, "agents are not available", code="store_unavailable")
    return services, services.agents


def _default(agents: Agents) -> dict[str, Any]:
    return {**agents.default.public(), "version": 0, "read_only": True}


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` over ``base``; the nested ``llm`` and ``tools`` objects field by field."""
    out = dict(base)
    for key, value in changes.items():
        if key in ("llm", "tools") and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def _validated(services: Services, data: dict[str, Any]) -> AgentProfile:
    try:
        profile = AgentProfile.model_validate(data)
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise ApiError(400, message, code="invalid_agent", param=param) from None
    voices = services.engine.voices
    if profile.voice and profile.voice not in voices:
        raise ApiError(400, f"voice {profile.voice!r} is not offered; the voices are: {', '.join(voices)}",
                       code="unknown_voice", param="voice")  # fmt: skip
    servers = profile.tools.mcp_servers
    configured = services.config.tools.mcp_servers
    unknown = sorted(set(servers or ()) - set(configured))
    if unknown:
        raise ApiError(400, f"no MCP servers {unknown} are configured (tools.mcp_servers: "
                       f"{', '.join(configured) or 'none'})", code="unknown_mcp_server", param="tools.mcp_servers")  # fmt: skip
    return profile


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or len(body) > MAX_BODY_KEYS:
        raise ApiError(400, "the body is a JSON object of an agent's fields", code="invalid_agent")
    return body


@router.get("/v1/agents")
async def list_agents(request: Request) -> dict[str, Any]:
    _, agents = _agents(request)
    try:
        stored = await agents.store.list_agents()
    except StoreError as exc:
        raise store_error(exc) from exc
    return {"default": _default(agents), "data": [a.public() for a in stored]}


async def _stored(agents: Agents, name: str) -> StoredAgent:
    try:
        stored = await agents.store.get(name)
    except StoreError as exc:
        raise store_error(exc) from exc
    if stored is None:
        raise ApiError(404, f"no agent {name!r}", code="unknown_agent", param="name")
    return stored


@router.get("/v1/agents/{name}")
async def get_agent(request: Request, name: Name) -> dict[str, Any]:
    _, agents = _agents(request)
    if name == DEFAULT_AGENT:
        return _default(agents)
    return (await _stored(agents, name)).public()


@router.post("/v1/agents", status_code=201)
async def create_agent(request: Request, body: Annotated[Any, Body()]) -> dict[str, Any]:
    services, agents = _agents(request)
    fields = _body(body)
    if fields.get("name") == DEFAULT_AGENT:
        raise ApiError(
            409, "the default agent comes from the config file", code="reserved_name", param="name"
        )
    base = agents.default.model_dump(mode="json")
    base["llm"]["api_key"] = "config"
    base.pop("name")
    base["description"] = ""
    profile = _validated(services, _merge(base, fields))
    try:
        stored = await agents.store.create(profile)
    except AgentExists as exc:
        raise ApiError(409, str(exc), code="agent_exists", param="name") from exc
    except TooManyAgents as exc:
        raise ApiError(409, str(exc), code="too_many_agents") from exc
    except StoreError as exc:
        raise store_error(exc) from exc
    log.info("agent %s created", profile.name)
    return stored.public()


@router.patch("/v1/agents/{name}")
async def edit_agent(request: Request, name: Name, body: Annotated[Any, Body()]) -> dict[str, Any]:
    services, agents = _agents(request)
    if name == DEFAULT_AGENT:
        raise ApiError(409, "the default agent comes from the config file: edit config.yaml",
                       code="read_only", param="name")  # fmt: skip
    fields = dict(_body(body))
    version = fields.pop("version", None)
    if version is not None and (not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise ApiError(400, "version: the agent's version as read (an integer)", code="invalid_agent",
                       param="version")  # fmt: skip
    if fields.get("name", name) != name:
        raise ApiError(
            400, "an agent's name cannot change: create another", code="invalid_agent", param="name"
        )
    for read_only in ("created_at", "updated_at", "read_only"):  # what GET shows besides the fields
        fields.pop(read_only, None)
    current = await _stored(agents, name)
    data = _merge(current.profile.model_dump(mode="json"), fields)
    if isinstance(data.get("llm"), dict) and isinstance(data["llm"].get("api_key"), str):
        data["llm"]["api_key"] = keep_masked_key(data["llm"]["api_key"], current.profile.llm.api_key)
    profile = _validated(services, data)
    try:
        stored = await agents.store.update(profile, expected_version=version)
    except AgentNotFound as exc:
        raise ApiError(404, str(exc), code="unknown_agent", param="name") from exc
    except VersionConflict as exc:
        raise ApiError(409, str(exc), code="version_conflict", param="version") from exc
    except StoreError as exc:
        raise store_error(exc) from exc
    log.info("agent %s edited (version %d)", name, stored.version)
    return stored.public()


@router.delete("/v1/agents/{name}", status_code=204, response_class=Response)
async def delete_agent(request: Request, name: Name) -> Response:
    _, agents = _agents(request)
    if name == DEFAULT_AGENT:
        raise ApiError(409, "the default agent comes from the config file", code="read_only", param="name")
    try:
        deleted = await agents.store.delete(name)
    except StoreError as exc:
        raise store_error(exc) from exc
    if not deleted:
        raise ApiError(404, f"no agent {name!r}", code="unknown_agent", param="name")
    log.info("agent %s deleted; its devices talk with the default agent", name)
    return Response(status_code=204)
