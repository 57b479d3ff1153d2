"""The gateway: HTTP (`/api` for the console, `/v1` for Agent keys), WebSocket live
pages and MCP tools in front of the coordinator and the preview service, which it calls
over gRPC (`upstream`); it holds no state of its own beyond sessions' cookies and the
live hub (docs/http-api.md, docs/architecture.md)."""
