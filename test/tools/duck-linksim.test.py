"""duck-linksim as a process: prints one 'linksim duck <i> port <p> backend
<host:port>' line a duck and 'linksim ready', forwards a connection to its
backend in order and no faster than the duck's link (256 KiB at 0.02 Gbit/s,
scaled from 0.2 by --scale 10: at least 0.1 s, a bound from below), and on
SIGTERM stops and prints each duck's bytes."""
import signal
import socket
import subprocess
import sys
import threading
import time

tool = sys.argv[1]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4)
got = bytearray()


def sink():
    c, _ = srv.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        got.extend(b)
    c.close()


t = threading.Thread(target=sink)
t.start()
p = subprocess.Popen([tool, "--backends", "127.0.0.1:%d" % srv.getsockname()[1],
                      "--duck-link-gbps", "0.2", "--scale", "10",
                      "--latency-us", "1000"],
                     stdout=subprocess.PIPE, text=True)
line = p.stdout.readline().split()
print(" ".join(line[:4]), line[5])  # linksim duck 0 port backend
print(p.stdout.readline().split()[:2])
data = bytes(i % 251 for i in range(256 << 10))
t0 = time.monotonic()
c = socket.create_connection(("127.0.0.1", int(line[4])))
c.sendall(data)
c.shutdown(socket.SHUT_WR)
t.join()
elapsed = time.monotonic() - t0
c.close()
print("in order" if bytes(got) == data else "CORRUPT")
print("limited" if elapsed >= 0.95 * len(data) * 8 / 0.02e9 else
      "TOO FAST %.3f s" % elapsed)
p.send_signal(signal.SIGTERM)
out, _ = p.communicate(timeout=20)
print(out, end="")
print("rc", p.returncode)
