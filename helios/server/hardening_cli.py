"""`flare run`'s security and connection flags (issue 42): the API key (also from FLARE_API_KEY, as
vLLM reads VLLM_API_KEY), CORS origins, fair admission share, and connection limits."""

from __future__ import annotations

import argparse
import ipaddress
import os

API_KEY_ENV = "FLARE_API_KEY"


def add_hardening_arguments(run: argparse.ArgumentParser, share, positive_float, positive_int) -> None:
    g = run.add_argument_group("security and connections")
    g.add_argument("--api-key", metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on /v1/* and /debug/* (default: ${API_KEY_ENV} "
                        "when set; /health, /metrics and the /dashboard page stay open)")
    g.add_argument("--allowed-origins", metavar="ORIGINS",
                   help="comma-separated origins that browsers may call from (CORS), or '*'; default none")
    g.add_argument("--client-share", type=share, default=0.5, metavar="FRACTION",
                   help="the most of the admission limit (slots + --max-queue) one client may hold: its `user` "
                        "field, else its address (default 0.5; 1 lets one client fill it)")
    g.add_argument("--header-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                   help="close a connection whose request headers have not arrived within this (default 10)")
    g.add_argument("--body-timeout", type=positive_float, default=30.0, metavar="SECONDS",
                   help="answer 408 to a request whose body has not arrived within this (default 30)")
    g.add_argument("--max-connections", type=positive_int, default=1000, metavar="N",
                   help="open connections at most; more are closed at once, and requests past it get 503 "
                        "(default 1000)")


def hardening_settings(args: argparse.Namespace, environ=os.environ) -> dict:
    """ServerSettings fields from the flags (the key from the environment when no flag gives it)."""
    key = args.api_key if args.api_key is not None else environ.get(API_KEY_ENV) or None
    origins = tuple(o.strip() for o in (args.allowed_origins or "").split(",") if o.strip())
    return {"api_key": key or None, "allowed_origins": origins, "client_share": args.client_share,
            "header_timeout_s": args.header_timeout, "body_timeout_s": args.body_timeout,
            "max_connections": args.max_connections}


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The startup warning for a server reachable beyond this machine without an API key."""
    if api_key is not None or _loopback(host):
        return None
    return (f"flare: warning: serving on {host} without an API key: anyone who can reach this address can use "
            f"the server; set --api-key or ${API_KEY_ENV}, or bind --host 127.0.0.1")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve beyond loopback
