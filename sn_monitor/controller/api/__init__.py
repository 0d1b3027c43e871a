"""The HTTP edge: routes, the OpenAPI document, the report and stream lanes, bodies, UI.

Turns requests into calls on the controller (``service``) and its domain errors into
statuses (one table, ``statuses.STATUS_OF``). May import ``service`` and everything
below it. Inside: ``app`` (the ASGI app) over ``router`` and ``openapi``, which serve
and document the route table of ``routes/`` (a module per resource); ``report_gate``,
``report_lane`` and ``stream_lane`` take the agents' reports; ``answers``, ``statuses``,
``body_headers``, ``bodies`` and ``controller_api`` are what they all share.
"""
