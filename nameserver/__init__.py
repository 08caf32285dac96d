"""The stateless name service: route table, processors, housekeeping.

Several nameservers run side by side and never talk to each other; every broker
registers with each one. Importable alone, and embedded by ``hamq broker`` when no
nameserver address is given (shared/DESIGN.md §1, §6).
"""
