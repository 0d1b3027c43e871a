"""The HTTP edge: routes, the OpenAPI document, the report and stream lanes, bodies, UI.

Turns requests into calls on the controller (``service``) and its domain errors into
statuses (one table, ``app.STATUS_OF``). May import ``service`` and everything below it.
"""
