"""Reliability and security tests: bad input end to end, real faults (SIGKILL, a
stopped or unreachable PostgreSQL), concurrent runs and readers, credentials and path safety.

Every test uses real processes and the real embedded PostgreSQL; ``docs/operations.md`` points
to the test proving each guarantee.
"""
