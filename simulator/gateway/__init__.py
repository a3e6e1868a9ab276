"""Admission and flow control in front of the engines, tenants and SLO classes (docs/ADMISSION.md).

config.py    GatewayConfig (SimConfig.gateway, ClusterConfig.gateway): rules, queuing, tenants, classes
rules.py     admission rules by name (queue_limit, token_bucket)
queues.py    queuing disciplines by name (fifo, wfq)
gateway.py   the Gateway on the SimPy clock
wiring.py    where it plugs in (a replay's clients, a cluster's arrivals)
"""
