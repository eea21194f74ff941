# Connect to a TCP server on the host's 127.0.0.1 (port on stdin) and to a public address.
# Expected: both fail (ENETUNREACH: no network interface at all); the host server sees no connection.
import errno
import socket
import sys

port = int(sys.stdin.read())
for addr in (("127.0.0.1", port), ("1.1.1.1", 53)):
    try:
        socket.create_connection(addr, timeout=2).close()
        print(addr[0], "CONNECTED")
    except OSError as e:
        print(addr[0], errno.errorcode.get(e.errno, str(e)))
