"""A ZooKeeper lock holder for fencegate's tests (the test kit's
`zookeeper::Holder`): a client as applications write them, with kazoo's Lock
recipe, which holds the lock until it is told to let go.

    holder.py HOSTS LOCK_PATH WHO OUT_DIR SESSION_TIMEOUT_S [USER:PASSWORD]

Once it holds the lock it writes OUT_DIR/held, as JSON: its znode's name, the
znode's sequence number, the fencing token (the zxid that created the znode:
its czxid) and its pid. It then holds the lock until SIGTERM, on which it
releases it and exits. SIGTERM while still
waiting ends the wait: its session is closed, so its znode goes at once.

With USER:PASSWORD it authenticates by digest and creates its znodes (the
lock's parents too) readable and writable by that user only.
"""

import json
import logging
import os
import signal
import sys

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock
from kazoo.security import CREATOR_ALL_ACL


class Terminated(Exception):
    pass


def on_sigterm(signum, frame):
    # Raised in the main thread wherever it waits (in the lock's wait for its
    # predecessor, or in pause()); kazoo's own threads are not interrupted.
    raise Terminated()


def write_held(out_dir, node, czxid):
    # Written aside then renamed: the test polls for the file and must never
    # read half of it.
    held = {"node": node, "sequence": int(node[-10:]), "token": czxid, "pid": os.getpid()}
    tmp = os.path.join(out_dir, "held.tmp")
    with open(tmp, "w") as f:
        json.dump(held, f)
    os.rename(tmp, os.path.join(out_dir, "held"))


def main():
    hosts, lock_path, who, out_dir, session_timeout = sys.argv[1:6]
    auth = sys.argv[6] if len(sys.argv) > 6 else None
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {who} %(levelname)s %(message)s")
    signal.signal(signal.SIGTERM, on_sigterm)
    client = KazooClient(
        hosts=hosts,
        timeout=float(session_timeout),
        auth_data=[("digest", auth)] if auth else None,
        default_acl=CREATOR_ALL_ACL if auth else None,
        # Only release() uses these: bounded, so a holder told to go while
        # the ensemble is down still exits.
        command_retry={"max_tries": 3},
    )
    lock = Lock(client, lock_path, identifier=who)
    try:
        client.start(timeout=30)
        lock.acquire()
        logging.info("holds %s/%s", lock_path, lock.node)
        # The fencing token the sidecar checks: the zxid that created the
        # holder's znode (docs/decisions/0010), not its sequence number.
        write_held(out_dir, lock.node, client.exists(f"{lock_path}/{lock.node}").czxid)
        while True:
            signal.pause()
    except Terminated:
        logging.info("SIGTERM: releasing")
    finally:
        try:
            lock.release()
        finally:
            # Closing the session deletes whatever ephemeral znode is left
            # (a waiter's, or one release() could not delete).
            client.stop()
            client.close()


if __name__ == "__main__":
    main()
