"""What the tests share: processes and ports, brokers and nameservers, stores, HA
groups, TLS material, waiting helpers and input strategies (one copy of each)."""
