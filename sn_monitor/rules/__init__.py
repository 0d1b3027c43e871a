"""The rules: from nodes' reports (and Alertmanager's alerts) to findings.

Top down, as .importlinter's ``rules-layers`` contract holds it: the engine
(:mod:`.engine`); what agents evaluate themselves (:mod:`.edge`); one evaluator per kind
of rule, none importing another (:mod:`.threshold`, :mod:`.baseline`, :mod:`.peers`,
:mod:`.event`, :mod:`.heartbeat`, :mod:`.alerts`); what they share (:mod:`.base`); the
rule files and a node as rules see it (:mod:`.spec`, :mod:`.view`); the numbers read
from a report and the XID catalogue (:mod:`.series`, :mod:`.xid_catalog`). The rules
import only the shared lower packages (model, config, clock, errors), never the controller,
the agent or an exporter.
"""
