"""What the tests share, one copy of each (a test file never imports another test file):

- timing.py     virtual_clock, and wait_for: the one bounded poll for state that other
                tasks, threads or processes change
- processes.py  real ``hamq`` processes: free ports, ready lines, kill by PID
- brokers.py    brokers and nameservers in this process; raw requests; create_topic
- store.py      small store configurations, a running store, put_many
- ha.py         master/slave groups of processes, FakeSlave (a hostile HA peer)
- autoswitch.py controller-mode clusters; ``hamq admin sync-state-set`` polls
- cluster.py    ``hamq cluster up`` as a child process
- raft.py       Raft groups in this process
- acl.py        ACL accounts and files
- metrics.py    scraping and reading metrics
- tls.py        TLS material; strategies.py: input strategies; rocketmq_driver.py: the
                official RocketMQ client, run as a child process
"""
