"""The relay a sandbox runs: 127.0.0.1:PORT inside, the gateway's unix socket behind it.

Standard library only and Python 3.6 syntax: it runs with whatever `python3` the task's image
has, passed inline (`python3 -c SOURCE SOCKET PORT`), so no file of the harness lands in the
sandbox. It binds the port (0: a free one), prints the port number on its one line of output,
then points its output at /dev/null and serves each connection with two byte pumps. It holds
no secret: the agent's token travels in the agent's environment, and the gateway checks it.
`NODE_RELAY` is the same for images with node and no python3.
"""

import contextlib
import os
import socket
import sys
import threading


def _pump(source, target):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def _serve(conn, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        conn.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, conn))
    back.daemon = True
    back.start()
    _pump(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def main(argv):
    path, port = argv[1], int(argv[2])
    with contextlib.suppress(OSError):
        os.setsid()  # out of the launching command's process group, if `setsid` was not there
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    sys.stdout.write(f"{listener.getsockname()[1]}\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        conn, _ = listener.accept()
        worker = threading.Thread(target=_serve, args=(conn, path))
        worker.daemon = True
        worker.start()


NODE_RELAY = """
const net = require('net');
const [path, port] = process.argv.slice(-2);
const server = net.createServer((conn) => {
  const up = net.connect(path);
  conn.pipe(up); up.pipe(conn);
  up.on('error', () => conn.destroy()); conn.on('error', () => up.destroy());
});
server.listen(Number(port), '127.0.0.1', () => {
  process.stdout.write(server.address().port + '\\n');
});
"""


if __name__ == "__main__":
    main(sys.argv)
