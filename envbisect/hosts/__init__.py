"""Hosts: transports (SSH, local), the agent scripts run on hosts, ordered co-restarts, and the
write-ahead journal and lock."""
