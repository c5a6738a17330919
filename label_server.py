# The human side of RL from preferences (C17 appendix B): people label clip pairs in a browser. Docs: README.md,
# "Labelling clips yourself" and "Label server API". Standard library only (http.server, sqlite3), plus tyro.
import contextlib
import csv
import errno
import hashlib
import io
import json
import math
import queue
import re
import secrets
import selectors
import socket
import sqlite3
import sys
import threading
import time
import traceback
import unicodedata
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Optional

import tyro


@dataclass
class Args:
    port: int = 8000
    """TCP port to listen on (0 picks a free one; the chosen port is printed)"""
    host: str = "127.0.0.1"
    """address to bind (IPv6 too, e.g. ::1); 0.0.0.0 lets raters on your LAN connect (then also set --token)"""
    db: str = "labels.sqlite"
    """the SQLite file that holds every clip, pair and answer (created if missing; WAL journal)"""
    token: Optional[str] = None
    """if set, the trainer's endpoints (upload clips, post pairs, read pairs and labels, close and keep, admin, export,
    import) need `Authorization: Bearer TOKEN`"""
    overlap: int = 1
    """answers needed per pair; the final label is their majority vote (a left/right tie becomes 'equal')"""
    golden_every: int = 5
    """serve a golden pair (known answer) to a rater every this many pairs, while they have unanswered ones"""
    golden_min: int = 3
    """golden pairs a rater must have answered before their accuracy on them can exclude them"""
    golden_threshold: float = 0.7
    """a rater whose accuracy on golden pairs falls below this stops counting towards labels"""
    max_clip_bytes: int = 16 * 1024 * 1024
    """largest clip upload, crowd result file (/api/import) or list of a resumed trainer's pairs (/keep) accepted (413
    above it)"""
    max_json_bytes: int = 64 * 1024
    """largest JSON request body accepted (413 above it), except a resumed trainer's list of pairs (max_clip_bytes)"""
    lease_seconds: float = 60.0
    """a pair handed to a rater is theirs this long (or until they answer; their page renews it while they are at it):
    others are given other pairs meanwhile"""
    live_seconds: float = 600.0
    """pairs of experiments whose trainer posted pairs or polled labels within this time are served first"""
    undo_seconds: float = 10.0
    """a rater may take an answer back this long; a label reaches the trainer only after it (0: at once, no undo)"""
    timeout: float = 30.0
    """seconds a connection may wait for its next request to arrive whole (idle keep-alive, a request sent halfway),
    and a worker for the rest of a request it reads itself (a clip's upload), before the connection is closed"""
    max_workers: int = 256
    """requests answered at once (one thread each); idle connections and requests still arriving wait without a thread"""
    public_url: Optional[str] = None
    """the address raters open when it is not this server's own, e.g. an HTTPS reverse proxy's
    (https://labels.example.org): its host is accepted in Host and Origin headers"""
    rater_keys: Optional[str] = None
    """a file of lines `name key`: each rater labels through their own link (/?key=KEY, printed at the start) and
    answers only in their own name; requests without a known key are refused"""
    quiet: bool = False
    """no line per request on stderr (errors and their tracebacks are still logged)"""


CHOICES = ("left", "right", "equal", "cant_tell")
METHODS = ("GET", "PUT", "POST")  # every other method gets 405 on a known path
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # no slashes, no leading dot, dash or underscore: never a path
RATER_SEPARATORS = " _.@-'·"  # besides letters, digits and combining marks, in any script (· as in Catalan l·l)
RATER_JOINERS = "\u200c\u200d"  # zero-width non-joiner and joiner, inside a name: Persian, Hindi, ... names as written
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# arrays and objects in each other in a request's JSON: a body nested much deeper would be read and stored, then fail to
# be sent back (json.dumps recurses, from deeper in a worker's stack) every time the trainer asks for it
MAX_JSON_DEPTH = 64

SCHEMA = """
CREATE TABLE IF NOT EXISTS clips (clip_id TEXT PRIMARY KEY, content_type TEXT NOT NULL, data BLOB NOT NULL,
                                  created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS pairs (pair_id TEXT PRIMARY KEY, experiment TEXT NOT NULL, left_clip TEXT NOT NULL,
                                  right_clip TEXT NOT NULL, instruction TEXT NOT NULL, metadata TEXT NOT NULL,
                                  golden TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS answers (pair_id TEXT NOT NULL, rater TEXT NOT NULL, choice TEXT NOT NULL,
                                    created REAL NOT NULL, PRIMARY KEY (pair_id, rater));
CREATE TABLE IF NOT EXISTS labels (seq INTEGER PRIMARY KEY AUTOINCREMENT, pair_id TEXT NOT NULL UNIQUE,
                                   experiment TEXT NOT NULL, choice TEXT NOT NULL, votes TEXT NOT NULL,
                                   created REAL NOT NULL, raters TEXT);
-- when a trainer last closed its experiment: a pair posted before that is not opened again by an undo
CREATE TABLE IF NOT EXISTS closed_experiments (experiment TEXT PRIMARY KEY, closed REAL NOT NULL);
-- pairs a resumed trainer no longer waits for (POST /api/experiments/<e>/keep): not opened again by an undo either
CREATE TABLE IF NOT EXISTS unwanted_pairs (pair_id TEXT PRIMARY KEY);
-- the highest label number each experiment's trainer has been sent (GET /api/labels): those labels are never taken back
CREATE TABLE IF NOT EXISTS sent_labels (experiment TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS labels_by_experiment ON labels (experiment, seq);
-- answers saved before rater names were normalised (then ASCII only): "Alice" and "alice " become "alice"; where both
-- answered a pair, the other spelling's answer keeps its old name (OR IGNORE) and still counts as another rater's
UPDATE OR IGNORE answers SET rater = lower(trim(rater)) WHERE rater != lower(trim(rater));
"""
# the highest label number an experiment's trainer has been sent (0 before any), for an SQL column naming the experiment
LAST_SENT = "COALESCE((SELECT seq FROM sent_labels s WHERE s.experiment = {}), 0)"
# after the `open` column exists (LabelStore adds it to older databases): the queue is walked through these, in order
INDEXES = """
CREATE INDEX IF NOT EXISTS open_pairs ON pairs (open, golden, created, pair_id);
CREATE INDEX IF NOT EXISTS open_pairs_by_experiment ON pairs (experiment, open, golden, created, pair_id);
CREATE INDEX IF NOT EXISTS golden_pairs ON pairs (golden) WHERE golden IS NOT NULL;
CREATE INDEX IF NOT EXISTS answers_by_rater ON answers (rater);
CREATE INDEX IF NOT EXISTS pairs_by_clips ON pairs (left_clip, right_clip);
"""


class ApiError(Exception):
    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def majority_vote(choices):
    """The final label of a pair from its counted answers: the most common choice; a tie between left and right, or
    any tie involving 'equal', becomes 'equal'; a tie between one side and 'cant_tell' goes to that side."""
    counts = {c: choices.count(c) for c in CHOICES}
    best = max(counts.values())
    top = {c for c in CHOICES if counts[c] == best}
    if len(top) == 1:
        return top.pop()
    if {"left", "right"} <= top or "equal" in top:
        return "equal"
    return (top - {"cant_tell"}).pop()


class LabelStore:
    """Everything the server knows, in one SQLite database. Every write is committed (WAL, synchronous=FULL) before
    the HTTP response acknowledges it, so a server killed at any moment loses nothing it acknowledged."""

    def __init__(
        self,
        path,
        overlap=1,
        golden_every=5,
        golden_min=3,
        golden_threshold=0.7,
        lease_seconds=60.0,
        live_seconds=600.0,
        undo_seconds=10.0,
    ):
        self.overlap, self.golden_every = overlap, golden_every
        self.golden_min, self.golden_threshold = golden_min, golden_threshold
        self.lease_seconds, self.live_seconds, self.undo_seconds = lease_seconds, live_seconds, undo_seconds
        self.lock = threading.Lock()
        # leases live in memory, not in SQLite: they are short, a restart only ends them early, and a page asking for
        # its next pair should not wait for a disk sync
        self.lease_of = {}  # rater -> (pair_id, monotonic expiry): the pair they were last given and have not answered
        self.lease_lock = threading.Lock()  # picking and leasing a pair is one step, or two raters could take one slot
        # experiment -> monotonic time its trainer last posted a pair or polled labels; under lock (a poll adding an
        # experiment while `next_pair` walks them would break that rater's request)
        self.seen = {}
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        # answers saved under an older rule for names (NFC case fold, joiners and full width kept): under today's name;
        # where both spellings answered a pair, the other's answer keeps its name (OR IGNORE), as in SCHEMA's update
        for (saved,) in self.db.execute("SELECT DISTINCT rater FROM answers").fetchall():
            with contextlib.suppress(ApiError):  # a name today's rule refuses stays as it was
                if (today := rater_name(saved)) != saved:
                    self.db.execute("UPDATE OR IGNORE answers SET rater = ? WHERE rater = ?", (today, saved))
        if "open" not in [row[1] for row in self.db.execute("PRAGMA table_info(pairs)")]:
            # a database from before the open flag: a pair is open (waiting for answers) until it has a label
            self.db.executescript(
                "BEGIN; ALTER TABLE pairs ADD COLUMN open INTEGER NOT NULL DEFAULT 1; "
                "UPDATE pairs SET open = 0 WHERE pair_id IN (SELECT pair_id FROM labels); COMMIT;"
            )
        if "raters" not in [row[1] for row in self.db.execute("PRAGMA table_info(labels)")]:
            # who gave a label's votes, so that only their answers can take it back; NULL for labels made before
            # (taking an answer back leaves those labels, as it does a label the answer was not one of the votes of)
            self.db.execute("ALTER TABLE labels ADD COLUMN raters TEXT")
        self.db.executescript(INDEXES)
        self._read_counts()
        with self._transaction():  # this start's --overlap or golden settings may count more answers
            self._label_pairs_whose_answers_count_now()

    def _read_counts(self):
        """What is kept in memory of the database, changed with every write that changes it (counting or grouping 100k
        rows per request is slow): the open pairs' count and the raters left out."""
        self.open_count = self.db.execute("SELECT COUNT(*) FROM pairs WHERE open = 1").fetchone()[0]
        self.excluded = self._excluded_raters()

    def _read(self, sql, params=()):
        with self.lock:
            return self.db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _transaction(self):
        """The block's statements all committed, or none (then the exception goes on, and what is kept in memory of
        the database is read from it again). Under lock."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            try:
                if self.db.in_transaction:  # (SQLite rolls back itself after some errors: a full disk, I/O)
                    self.db.execute("ROLLBACK")
            finally:
                self._read_counts()
            raise

    def put_clip(self, clip_id, content_type, data):
        with self.lock:  # autocommit: the statement is durable when execute returns
            self.db.execute("INSERT OR REPLACE INTO clips VALUES (?, ?, ?, ?)", (clip_id, content_type, data, time.time()))

    def get_clip(self, clip_id):
        rows = self._read("SELECT content_type, data FROM clips WHERE clip_id = ?", (clip_id,))
        return rows[0] if rows else None

    def add_pair(self, pair):
        """Returns True if the pair is new, False if the same pair was posted before (harmless)."""
        with self.lock:
            self.seen[pair["experiment"]] = time.monotonic()
            missing = [c for c in (pair["left_clip"], pair["right_clip"]) if not self._has_clip(c)]
            if missing:
                raise ApiError(HTTPStatus.NOT_FOUND, f"unknown clip: {missing[0]} (upload it with PUT /api/clips/<id>)")
            row = self.db.execute(
                "SELECT experiment, left_clip, right_clip, golden FROM pairs WHERE pair_id = ?", (pair["pair_id"],)
            ).fetchone()
            if row is not None:
                differs = [
                    f"another {what} ({had}, not {given})"
                    for what, had, given in zip(
                        ("experiment", "left clip", "right clip", "golden answer"),
                        row,
                        (pair["experiment"], pair["left_clip"], pair["right_clip"], pair["golden"]),
                    )
                    if had != given
                ]
                if differs:
                    raise ApiError(HTTPStatus.CONFLICT, f"pair {pair['pair_id']} exists with {', '.join(differs)}")
                return False
            self.db.execute(
                "INSERT INTO pairs (pair_id, experiment, left_clip, right_clip, instruction, metadata, golden, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    pair["pair_id"],
                    pair["experiment"],
                    pair["left_clip"],
                    pair["right_clip"],
                    pair["instruction"],
                    json.dumps(pair["metadata"]),
                    pair["golden"],
                    time.time(),
                ),
            )
            self.open_count += 1
            return True

    def close_experiment(self, experiment):
        """No more answers wanted for this experiment's open pairs (its run has ended): they are no longer served, and
        its trainer no longer counts as live. Pairs it posts later are open as usual. Returns how many were closed."""
        with self.lock:
            with self._transaction():
                self.db.execute("INSERT OR REPLACE INTO closed_experiments VALUES (?, ?)", (experiment, time.time()))
                closed = self.db.execute("UPDATE pairs SET open = 0 WHERE experiment = ? AND open = 1", (experiment,)).rowcount
            self.open_count -= closed
            self.seen.pop(experiment, None)
        return closed

    def keep_open(self, experiment, pair_ids):
        """Of this experiment's open pairs, close all but `pair_ids`: a resumed trainer waits for those only (a run
        killed after its last save posted pairs it has no record of; their answers would reach no one). Unlike
        close_experiment, the experiment is not ended. Golden pairs stay. Returns how many were closed."""
        keep = set(pair_ids)
        with self.lock:
            with self._transaction():
                rows = self.db.execute(
                    "SELECT pair_id FROM pairs WHERE experiment = ? AND open = 1 AND golden IS NULL", (experiment,)
                )
                unwanted = [(pair_id,) for (pair_id,) in rows.fetchall() if pair_id not in keep]
                self.db.executemany("UPDATE pairs SET open = 0 WHERE pair_id = ?", unwanted)
                self.db.executemany("INSERT OR IGNORE INTO unwanted_pairs VALUES (?)", unwanted)
            self.open_count -= len(unwanted)
        return len(unwanted)

    def _has_clip(self, clip_id):
        return self.db.execute("SELECT 1 FROM clips WHERE clip_id = ?", (clip_id,)).fetchone() is not None

    def _excluded_raters(self):
        """Raters whose accuracy on golden pairs is below the threshold (after at least golden_min of them)."""
        rows = self.db.execute(
            # CROSS JOIN: SQLite walks the golden pairs (an index), not every answer
            "SELECT a.rater, COUNT(*), SUM(a.choice = p.golden) FROM pairs p CROSS JOIN answers a USING (pair_id) "
            "WHERE p.golden IS NOT NULL GROUP BY a.rater"
        ).fetchall()
        return {r for r, n, correct in rows if n >= self.golden_min and correct / n < self.golden_threshold}

    def rater_stats(self, rater):
        """A rater's progress: pairs they answered, pairs waiting for them, and whether their answers still count
        (not when their accuracy on golden pairs is below the threshold)."""
        with self.lease_lock:
            leased = self._leased_by_others(rater, time.monotonic())
            with self.lock:
                return {
                    "answered": self._answered(rater),
                    "waiting": self._waiting(rater, leased),
                    "counted": rater not in self.excluded,
                }

    def _answered(self, rater):
        return self.db.execute("SELECT COUNT(*) FROM answers WHERE rater = ?", (rater,)).fetchone()[0]

    def _leased_by_others(self, rater, now):
        """How many other raters whose answers count hold a lease on each pair (one whose answer would not make its
        label holds none back). Under lease_lock."""
        self.lease_of = {r: lease for r, lease in self.lease_of.items() if lease[1] > now}  # expired: back in the queue
        excluded = self.excluded  # replaced whole, never changed in place: read without the lock
        return Counter(pair_id for r, (pair_id, _) in self.lease_of.items() if r != rater and r not in excluded)

    def _available(self, pair_id, golden, leased):
        """May this open pair, which the rater has not answered, be given to them? Golden pairs are for every rater;
        another pair only while its counted answers and others' leases on it are fewer than `overlap`. Under lock."""
        if golden or not leased[pair_id]:  # an open pair has fewer than `overlap` counted answers, or it has a label
            return True
        raters = self.db.execute("SELECT rater FROM answers WHERE pair_id = ?", (pair_id,)).fetchall()
        return sum(r not in self.excluded for (r,) in raters) + leased[pair_id] < self.overlap

    def _first_available(self, rater, leased, golden, experiment=None):
        """(created, pair_id) of the oldest open pair (golden or not; of one experiment, if given) this rater may be
        given, or None. Walks the open pairs in order through an index and stops at the first: pairs the rater answered
        are skipped inside SQLite, pairs held back by leases are at most one per lease. Under lock."""
        where = "golden IS NOT NULL" if golden else "golden IS NULL"
        params = (rater,)
        if experiment is not None:
            where, params = where + " AND experiment = ?", (experiment, rater)
        rows = self.db.execute(
            f"SELECT created, pair_id FROM pairs p WHERE open = 1 AND {where} AND NOT EXISTS "
            "(SELECT 1 FROM answers a WHERE a.pair_id = p.pair_id AND a.rater = ?) ORDER BY created, pair_id",
            params,
        )
        return next((row for row in rows if self._available(row[1], golden, leased)), None)

    def _waiting(self, rater, leased):
        """How many open pairs this rater may still be given: the open pairs, less those they answered, those held
        back by other raters' leases and the golden pairs not due yet. Under lease_lock and lock."""
        answered_open = self.db.execute(
            # CROSS JOIN: SQLite walks the rater's answers (an index), not every open pair
            "SELECT COUNT(*) FROM answers a CROSS JOIN pairs p USING (pair_id) WHERE a.rater = ? AND p.open = 1",
            (rater,),
        ).fetchone()[0]
        held_back = 0
        for pair_id in leased:
            row = self.db.execute(
                "SELECT open, golden IS NOT NULL, EXISTS (SELECT 1 FROM answers WHERE pair_id = ? AND rater = ?) "
                "FROM pairs WHERE pair_id = ?",
                (pair_id, rater, pair_id),
            ).fetchone()
            if row and row[0] and not row[2] and not self._available(pair_id, row[1], leased):
                held_back += 1
        # golden pairs: one at its turn (one pair in every golden_every), none between
        golden_open = self.db.execute(
            "SELECT COUNT(*) FROM pairs p WHERE open = 1 AND golden IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM answers a WHERE a.pair_id = p.pair_id AND a.rater = ?)",
            (rater,),
        ).fetchone()[0]
        golden_due = golden_open > 0 and self._answered(rater) % self.golden_every == 0
        return self.open_count - answered_open - held_back - golden_open + golden_due

    def next_pair(self, rater, showing=None):
        """The pair to show this rater, leased to them for lease_seconds; None if there is none. `showing`: the pair
        their page shows, given again (its lease renewed) while it still needs their answer, though its lease ran out."""
        with self.lease_lock:
            now = time.monotonic()
            leased = self._leased_by_others(rater, now)
            with self.lock:
                answered = self._answered(rater)
                mine = self.lease_of.get(rater, (None,))[0]
                # asked again before answering (a reload, or the page renewing its lease): the same pair, not one more
                # taken. The rater's live lease first (an undo's pair, leased as the page's renewal was on its way), then
                # the page's pair while it is open, not answered by the rater and not taken by others' leases
                kept = [
                    p
                    for p in dict.fromkeys([mine, showing])
                    if p is not None and self._still_needs(p, rater, p == mine, leased)
                ]
                if kept:
                    pair_id = kept[0]
                else:
                    # pairs of experiments whose trainer is still there first (a run that ended no longer needs
                    # labels), oldest first; then the rest, oldest first
                    live = [e for e, seen in self.seen.items() if now - seen < self.live_seconds]
                    candidates = [self._first_available(rater, leased, False, e) for e in live]
                    ordinary = min((c for c in candidates if c), default=None) or self._first_available(rater, leased, False)
                    golden = self._first_available(rater, leased, True)
                    # golden pairs mixed in: one every `golden_every` pairs (the first pair included) while any is left,
                    # and only then, other pairs waiting or not (else raters who come before the trainer's first
                    # pairs would use up the checks before the real work)
                    chosen = golden if golden and answered % self.golden_every == 0 else ordinary
                    if chosen is None:
                        return None
                    pair_id = chosen[1]
                self.lease_of[rater] = (pair_id, now + self.lease_seconds)  # one pair per rater; a reload renews it
                waiting = self._waiting(rater, leased)
                row = self.db.execute(
                    "SELECT pair_id, experiment, left_clip, right_clip, instruction FROM pairs WHERE pair_id = ?",
                    (pair_id,),
                ).fetchone()
        keys = ("pair_id", "experiment", "left_clip", "right_clip", "instruction")
        pair = dict(zip(keys, row))
        pair["left_url"], pair["right_url"] = f"/clips/{pair['left_clip']}", f"/clips/{pair['right_clip']}"
        pair["rater"], pair["answered"], pair["waiting"] = rater, answered, waiting
        pair["counted"] = rater not in self.excluded
        pair["undo_seconds"], pair["lease_seconds"] = self.undo_seconds, self.lease_seconds
        return pair

    def _still_needs(self, pair_id, rater, leased_to_rater, leased):
        """Can this pair be given to the rater again: open, not answered by them, and theirs (a live lease) or not held
        back by other raters' leases? Under lease_lock and lock."""
        row = self.db.execute(
            "SELECT golden IS NOT NULL FROM pairs p WHERE pair_id = ? AND open = 1 AND NOT EXISTS "
            "(SELECT 1 FROM answers a WHERE a.pair_id = p.pair_id AND a.rater = ?)",
            (pair_id, rater),
        ).fetchone()
        return row is not None and (leased_to_rater or self._available(pair_id, row[0], leased))

    def get_pair(self, pair_id):
        """A pair as the trainer posted it, with its answers and, once final, its label."""
        rows = self._read(
            "SELECT p.experiment, p.left_clip, p.right_clip, p.instruction, p.metadata, p.golden, l.seq, l.choice "
            "FROM pairs p LEFT JOIN labels l USING (pair_id) WHERE p.pair_id = ?",
            (pair_id,),
        )
        if not rows:
            return None
        experiment, left, right, instruction, metadata, golden, seq, label = rows[0]
        answers = self._read("SELECT rater, choice FROM answers WHERE pair_id = ? ORDER BY created", (pair_id,))
        return {
            "pair_id": pair_id,
            "experiment": experiment,
            "left_clip": left,
            "right_clip": right,
            "instruction": instruction,
            "metadata": json.loads(metadata),
            "golden": golden,
            "answers": [{"rater": r, "choice": c} for r, c in answers],
            "label": None if seq is None else {"seq": seq, "choice": label},
        }

    def add_answer(self, pair_id, rater, choice):
        """Record a rater's answer (the first one counts; a repeat is ignored). Returns (new answer?, pair final?)."""
        # the lease ends only once the answer is recorded, in one step under both locks (in next_pair's order): a pair
        # neither leased nor answered in between could be given to another rater, whose answer would be wasted
        with self.lease_lock, self.lock:
            pair = self.db.execute("SELECT experiment, golden IS NOT NULL FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone()
            if pair is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"unknown pair: {pair_id}")
            experiment, golden = pair
            with self._transaction():
                cursor = self.db.execute(
                    "INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?)", (pair_id, rater, choice, time.time())
                )
                new = cursor.rowcount == 1
                final, closed = self._finalize(pair_id, experiment, golden)
                self.open_count -= closed
                if new and golden:  # the rater's accuracy on golden pairs changed
                    self._count_raters_again()
            if self.lease_of.get(rater, (None,))[0] == pair_id:  # answered: the lease has done its job (an answer to
                del self.lease_of[rater]  # another pair leaves it)
        return new, final

    def undo_answer(self, pair_id, rater):
        """Take back a rater's answer given less than undo_seconds ago. If the pair's label was made from it, the label
        goes too (it is as young: the trainer has not been sent it) and the answers left may make a new one; an answer
        that came after the label (two raters given one pair, a lease having expired) goes alone. Returns whether the
        pair is open again: then it is leased to the rater, so that their page shows it next."""
        with self.lease_lock, self.lock:
            row = self.db.execute(
                "SELECT a.created, p.experiment, p.golden IS NOT NULL, p.created, l.raters, l.created, "
                f"l.seq <= {LAST_SENT.format('p.experiment')} "
                "FROM answers a JOIN pairs p USING (pair_id) LEFT JOIN labels l USING (pair_id) "
                "WHERE a.pair_id = ? AND a.rater = ?",
                (pair_id, rater),
            ).fetchone()
            if row is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"no answer of {rater} to {pair_id} to take back")
            answered, experiment, golden, posted, label_raters, labelled, sent = row
            made_label = rater in json.loads(label_raters or "[]")
            if made_label and sent:  # (its age alone would not do: a restart with a longer --undo-seconds, the clock)
                raise ApiError(HTTPStatus.CONFLICT, "too late to take back: the trainer has been sent the label it made")
            now = time.time()
            # a label is younger than its votes, unless the clock stepped back; labels undo_seconds old go to the trainer
            if now - answered > self.undo_seconds or (made_label and now - labelled >= self.undo_seconds):
                message = f"too late to take back: answers can be taken back for {self.undo_seconds:g} s"
                raise ApiError(HTTPStatus.CONFLICT, message)
            with self._transaction():  # all or nothing: a retried undo finds the answer if any of it failed
                self.db.execute("DELETE FROM answers WHERE pair_id = ? AND rater = ?", (pair_id, rater))
                if made_label:
                    self._take_back_label(pair_id, experiment, golden, posted)
                if golden:  # a golden answer: the rater's accuracy changed
                    left_out = self.excluded
                    self._count_raters_again()
                    # left out again: the labels their votes made since that answer counted them again go (as young:
                    # not sent); their pairs wait for an answer that counts
                    self._take_back_labels_of(self.excluded - left_out, since=answered)
            still_open = self.db.execute("SELECT open FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone() == (1,)
            if still_open:
                self.lease_of[rater] = (pair_id, time.monotonic() + self.lease_seconds)
            return still_open

    def _take_back_label(self, pair_id, experiment, golden, posted):
        """Inside a transaction: delete the pair's label; the answers left may make another, else the pair is open
        again (unless its trainer closed it)."""
        self.db.execute("DELETE FROM labels WHERE pair_id = ?", (pair_id,))
        final, _ = self._finalize(pair_id, experiment, golden)
        if not final and not self._closed_by_trainer(pair_id, experiment, posted):
            self.open_count += self.db.execute("UPDATE pairs SET open = 1 WHERE pair_id = ? AND open = 0", (pair_id,)).rowcount

    def _take_back_labels_of(self, raters, since):
        """Inside a transaction: the labels made since `since` (a time) with a vote of one of `raters`, and not yet
        sent, taken back."""
        if not raters:
            return
        rows = self.db.execute(
            "SELECT l.pair_id, l.experiment, l.raters, p.created FROM labels l JOIN pairs p USING (pair_id) "
            f"WHERE l.created >= ? AND l.seq > {LAST_SENT.format('l.experiment')}",
            (since,),
        ).fetchall()
        for pair_id, experiment, voters, posted in rows:
            if raters & set(json.loads(voters or "[]")):
                self._take_back_label(pair_id, experiment, False, posted)

    def _count_raters_again(self):
        """Inside a transaction: work out again which raters' answers count, after an answer to a golden pair."""
        before, self.excluded = self.excluded, self._excluded_raters()
        if before - self.excluded:  # raters counted again: their answers may complete pairs still open
            self._label_pairs_whose_answers_count_now(before - self.excluded)

    def _label_pairs_whose_answers_count_now(self, raters=None):
        """Inside a transaction: label and close the open pairs that have `overlap` counted answers: their last answer
        came while it did not count (its rater left out for golden pairs, since counted again; a smaller --overlap
        since a restart), so no answer made the label. Only the pairs `raters` answered, if given."""
        query = "SELECT DISTINCT p.pair_id, p.experiment FROM answers a JOIN pairs p USING (pair_id) "
        query += "WHERE p.open = 1 AND p.golden IS NULL"
        if raters is not None:
            query += f" AND a.rater IN ({', '.join('?' * len(raters))})"
        rows = self.db.execute(query, sorted(raters or ())).fetchall()
        for pair_id, experiment in rows:
            self.open_count -= self._finalize(pair_id, experiment, False)[1]

    def _closed_by_trainer(self, pair_id, experiment, posted):
        """Has the pair's trainer closed it: the whole experiment since the pair was posted, or the pair itself (keep)?
        Under lock."""
        row = self.db.execute("SELECT closed FROM closed_experiments WHERE experiment = ?", (experiment,)).fetchone()
        if row is not None and row[0] >= posted:
            return True
        return self.db.execute("SELECT 1 FROM unwanted_pairs WHERE pair_id = ?", (pair_id,)).fetchone() is not None

    def _finalize(self, pair_id, experiment, golden):
        """Inside a transaction: publish the pair's label once it has `overlap` counted answers (never golden), and
        close it. Returns (final?, pairs closed: 0 or 1)."""
        if self.db.execute("SELECT 1 FROM labels WHERE pair_id = ?", (pair_id,)).fetchone():
            return True, 0
        if golden:
            return False, 0
        rows = self.db.execute("SELECT rater, choice FROM answers WHERE pair_id = ? ORDER BY created", (pair_id,))
        counted = [(rater, choice) for rater, choice in rows if rater not in self.excluded][: self.overlap]
        if len(counted) < self.overlap:
            return False, 0
        raters, votes = [rater for rater, _ in counted], [choice for _, choice in counted]
        self.db.execute(
            "INSERT INTO labels (pair_id, experiment, choice, votes, raters, created) VALUES (?, ?, ?, ?, ?, ?)",
            (pair_id, experiment, majority_vote(votes), json.dumps(votes), json.dumps(raters), time.time()),
        )
        # an answer to a pair its trainer closed is still recorded and labelled; it stays closed
        return True, self.db.execute("UPDATE pairs SET open = 0 WHERE pair_id = ? AND open = 1", (pair_id,)).rowcount

    def last_label_number(self):
        """The highest sequence number this database has given a label (0 before any): AUTOINCREMENT never reuses one,
        even after an undo removed its label."""
        return self._read("SELECT COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'labels'), 0)")[0][0]

    def labels_since(self, experiment, since, limit=1000):
        """The experiment's labels after sequence number `since`, up to the first one still young enough to be taken
        back (labels are numbered in the order they are made, so none is skipped)."""
        with self.lock:
            self.seen[experiment] = time.monotonic()  # its trainer is polling: its pairs are wanted
            # up to the first label still young enough to be taken back, by sequence number, not by clock time (the
            # trainer asks for labels after the last number it has: none may be passed over, even if the clock stepped
            # back)
            rows = self.db.execute(
                "SELECT l.seq, l.pair_id, l.choice, l.votes, p.metadata FROM labels l JOIN pairs p USING (pair_id) "
                "WHERE l.experiment = ? AND l.seq > ? AND l.seq < COALESCE((SELECT MIN(seq) FROM labels "
                "WHERE experiment = ? AND seq > ? AND created > ?), 9223372036854775807) ORDER BY l.seq LIMIT ?",
                (experiment, since, experiment, since, time.time() - self.undo_seconds, limit),
            ).fetchall()
            if rows:  # sent (in the same step as read: no undo in between): never taken back now
                with self._transaction():
                    self.db.execute(
                        "INSERT INTO sent_labels VALUES (?, ?) ON CONFLICT (experiment) DO UPDATE SET seq = MAX(seq, "
                        "excluded.seq)",
                        (experiment, rows[-1][0]),
                    )
        return [
            {"seq": seq, "pair_id": pair_id, "choice": choice, "votes": json.loads(votes), "metadata": json.loads(meta)}
            for seq, pair_id, choice, votes, meta in rows
        ]

    def summary(self):
        """For whoever runs the labelling: per experiment its queue, and per rater their answers, golden accuracy and
        agreement with the other raters of the same pairs, for each experiment (all its raters, and each of them) and
        over all of them. Reads every answer: an occasional request, not a rater's."""
        now = time.time()
        rows = self._read(
            "SELECT p.experiment, a.pair_id, a.rater, a.choice, p.golden FROM answers a JOIN pairs p USING (pair_id)"
        )
        by_pair = {}
        for experiment, pair_id, rater, choice, golden in rows:
            by_pair.setdefault((experiment, pair_id), []).append((rater, choice, golden))
        # counts per (experiment, rater), None standing for all: (None, None) is everyone's answers to every experiment
        tallies = {}
        for (experiment, _), answers in by_pair.items():
            for rater, choice, golden in answers:
                others = [c for r, c, _ in answers if r != rater]
                for key in ((experiment, rater), (experiment, None), (None, rater), (None, None)):
                    tally = tallies.setdefault(key, Counter())
                    tally["answers"] += 1
                    tally["golden"] += golden is not None
                    tally["golden_correct"] += golden is not None and choice == golden
                    tally["agree"] += sum(c == choice for c in others)
                    tally["compared"] += len(others)

        def figures(experiment, rater):
            tally = tallies.get((experiment, rater), Counter())
            return {
                "answers": tally["answers"],
                "golden_answered": tally["golden"],
                "golden_accuracy": round(tally["golden_correct"] / tally["golden"], 3) if tally["golden"] else None,
                # the share of other raters' answers to the same pairs that were the same as theirs
                "agreement": round(tally["agree"] / tally["compared"], 3) if tally["compared"] else None,
            }

        raters = sorted({rater for _, rater in tallies if rater is not None})
        experiments = [
            {
                "experiment": experiment,
                "pairs": pairs,
                "open": open_pairs,
                "labels": labelled,
                "oldest_open_seconds": None if oldest is None else round(now - oldest, 1),
                "live": time.monotonic() - self.seen.get(experiment, -float("inf")) < self.live_seconds,
                **figures(experiment, None),
                "raters": [
                    {"rater": rater, **figures(experiment, rater)} for rater in raters if (experiment, rater) in tallies
                ],
            }
            for experiment, pairs, open_pairs, labelled, oldest in self._read(
                "SELECT experiment, COUNT(*), SUM(open), SUM(pair_id IN (SELECT pair_id FROM labels)), "
                "MIN(CASE WHEN open = 1 THEN created END) FROM pairs GROUP BY experiment ORDER BY experiment"
            )
        ]
        everyone = figures(None, None)
        return {
            "experiments": experiments,
            "raters": [{"rater": rater, **figures(None, rater), "excluded": rater in self.excluded} for rater in raters],
            "agreement": everyone["agreement"],
            "golden_accuracy": everyone["golden_accuracy"],
        }

    def export(self, what, experiment=None):
        """Rows (dicts) of every answer, label or open pair, of one experiment or all, oldest first."""
        where, params = ("WHERE p.experiment = ?", (experiment,)) if experiment else ("", ())
        if what == "answers":
            sql = (
                "SELECT p.experiment, a.pair_id, p.left_clip, p.right_clip, a.rater, a.choice, p.golden, a.created, "
                f"p.metadata FROM answers a JOIN pairs p USING (pair_id) {where} ORDER BY a.created, a.pair_id, a.rater"
            )
            keys = ("experiment", "pair_id", "left_clip", "right_clip", "rater", "choice", "golden", "created", "metadata")
        elif what == "labels":
            sql = (
                "SELECT l.seq, p.experiment, l.pair_id, p.left_clip, p.right_clip, l.choice, l.votes, l.created, "
                f"p.metadata FROM labels l JOIN pairs p USING (pair_id) {where} ORDER BY l.seq"
            )
            keys = ("seq", "experiment", "pair_id", "left_clip", "right_clip", "choice", "votes", "created", "metadata")
        else:  # the pairs that still want answers, e.g. to send to a crowd platform
            sql = (
                "SELECT p.experiment, p.pair_id, p.left_clip, p.right_clip, p.instruction, p.golden, p.created, p.metadata "
                f"FROM pairs p {where + (' AND' if where else 'WHERE')} p.open = 1 ORDER BY p.created, p.pair_id"
            )
            keys = ("experiment", "pair_id", "left_clip", "right_clip", "instruction", "golden", "created", "metadata")
        rows = [dict(zip(keys, row)) for row in self._read(sql, params)]
        for row in rows:
            row["metadata"] = json.loads(row["metadata"])
            if "votes" in row:
                row["votes"] = json.loads(row["votes"])
        return rows

    def pair_of_clips(self, first_clip, second_clip):
        """(pair_id, swapped) of the pair showing these two clips, left and right (or the other way round: swapped);
        None if there is none or the clips make more than one pair."""
        rows = self._read(
            "SELECT pair_id, left_clip != ? FROM pairs WHERE (left_clip = ? AND right_clip = ?) "
            "OR (left_clip = ? AND right_clip = ?) LIMIT 2",
            (first_clip, first_clip, second_clip, second_clip, first_clip),
        )
        return (rows[0][0], bool(rows[0][1])) if len(rows) == 1 else None

    def counts(self):
        return {table: self._read(f"SELECT COUNT(*) FROM {table}")[0][0] for table in ("clips", "pairs", "answers", "labels")}


def sniff_content_type(data, declared):
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "video/webm"
    if data[4:8] == b"ftyp":
        return "video/mp4"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "image/png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return declared if declared and declared.startswith(("video/", "image/")) else "application/octet-stream"


def plain_int(text):
    """A count or sequence number: 1-18 ASCII digits (str.isdigit also takes '²', int() fails on 5000 digits and SQLite
    on 2**63), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def reject_non_json_number(name):
    raise ValueError(f"{name} is not a JSON number")


def finite_json_number(text):
    """A JSON number as a float; one too large for it (1e999, which Python reads as inf) would be sent back as Infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is too large a number")
    return value


def json_depth(value):
    """How deeply arrays and objects nest in parsed JSON: 0 for a number or string, 1 for [1, 2] or {}. A level at a
    time, not by recursion."""
    depth, level = 0, [value]
    while level := [v for v in level if isinstance(v, (dict, list))]:
        depth += 1
        level = [child for container in level for child in (container.values() if isinstance(container, dict) else container)]
    return depth


def host_name(host):
    """'localhost' of a Host header 'localhost:8000', '::1' of '[::1]:8000'."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if ":" in host else host


def origin_host(origin):
    """The host (and port) an Origin header names; None where it is no URL."""
    try:
        return urllib.parse.urlsplit(origin).netloc
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def request_path(target):
    """A request target's path, without its query (and without the token a query may carry); None where it is no
    URL."""
    try:
        return urllib.parse.urlsplit(target).path
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def clip_id_of(value):
    """A clip's id from a crowd platform's column: the id itself, or the URL it was served at (.../clips/<id>)."""
    try:
        path = urllib.parse.urlsplit((value or "").strip()).path
    except ValueError:  # no URL (an unclosed IPv6 bracket): a bad row
        return None
    value = urllib.parse.unquote(path.rstrip("/").rpartition("/")[2])
    return value if ID_PATTERN.fullmatch(value) else None


def require_id(value, what):
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise ApiError(
            HTTPStatus.BAD_REQUEST, f"{what} must be 1-128 letters, digits, '_', '.' or '-', the first a letter or digit"
        )
    return value


def rater_name(name):
    """A rater's identity: names that differ only by case, surrounding spaces, Unicode composition, width, ligatures or
    zero-width joiners are one rater ("Alice ", "alice"; "José" typed either way; full-width "ａｌｉｃｅ"). Letters and
    digits of any script (and the zero-width joiners inside), not control characters. The identity is kept as Unicode's
    NFKC case fold without the joiners, at most 64 characters, and is itself a name that maps to itself."""

    def well_formed(name, joiners_inside):
        kinds = [unicodedata.category(c)[0] for c in name]  # L letter, N number, M combining mark, C control...
        allowed = [
            k in "LNM" or c in RATER_SEPARATORS or (joiners_inside and c in RATER_JOINERS and 0 < i < len(name) - 1)
            for i, (c, k) in enumerate(zip(name, kinds))
        ]
        return 0 < len(name) and kinds[0] in "LN" and all(allowed)

    if isinstance(name, str) and well_formed(name := unicodedata.normalize("NFC", name.strip()), joiners_inside=True):
        kept = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())  # may be longer: ß is ss
        kept = "".join(c for c in kept if c not in RATER_JOINERS)
        if len(kept) > 64:
            message = f"'rater' is {len(kept)} characters as kept (lower case, ß as ss, ﬁ as fi, no joiners): at most 64"
            raise ApiError(HTTPStatus.BAD_REQUEST, message)
        if not well_formed(kept, joiners_inside=False):  # e.g. ½ is 1⁄2, Catalan ŀ is l·
            message = f"'rater' {name!r} is {kept!r} in Unicode's compatibility form (NFKC): not letters and digits"
            raise ApiError(HTTPStatus.BAD_REQUEST, message)
        return kept
    raise ApiError(
        HTTPStatus.BAD_REQUEST, "'rater' must be 1-64 letters, digits, spaces or _ . @ - ' ·, starting with a letter or digit"
    )


def load_rater_keys(path):
    """{key: rater} from a file of lines `name key` (blank lines skipped, and a line's words from one that starts with
    '#'); a bad line stops the server."""
    rater_of_key, line_of_key, name_of_rater = {}, {}, {}  # name_of_rater: (line, name as written)
    try:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                words = line.split()
                words = words[: next((i for i, word in enumerate(words) if word.startswith("#")), len(words))]
                if not words:
                    continue
                where = f"{path} line {number}"
                if len(words) < 2:
                    raise SystemExit(f"error: {where}: expected a name and a key, e.g. `alice {secrets.token_urlsafe(12)}`")
                name, key = " ".join(words[:-1]), words[-1]
                if not (key.isascii() and key.isprintable()):  # the page sends it as a request header, X-Rater-Key
                    raise SystemExit(f"error: {where}: a key must be printable ASCII (the rater's page sends it in a header)")
                try:
                    rater = rater_name(name)
                except ApiError as error:
                    raise SystemExit(f"error: {where}: {error.message}") from None
                if key in line_of_key:
                    raise SystemExit(f"error: {where}: this key is also line {line_of_key[key]}'s")
                if rater in name_of_rater:
                    first_number, first_name = name_of_rater[rater]
                    message = f"{name!r} is the rater of line {first_number}, {first_name!r}"
                    raise SystemExit(f"error: {where}: {message} (names that differ only by case, width or joiners are one)")
                rater_of_key[key], line_of_key[key], name_of_rater[rater] = rater, number, (number, name)
    except OSError as error:
        raise SystemExit(f"error: cannot read --rater-keys {path}: {error}") from None
    return rater_of_key


def make_handler(store, args, rater_of_key=None):
    loopback_only = args.host in LOOPBACK_NAMES  # then every request's Host must name this machine (or --public-url)
    public = urllib.parse.urlsplit(args.public_url).netloc if args.public_url else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive and byte ranges for the video elements
        server_version = "label_server"
        timeout = args.timeout  # a client not reading its reply (or slow to send a clip: RequestReader) must not hold a worker

        # --- one request per worker: the server's main thread waits for it to arrive, and for the next one ---
        def __init__(self, request, client_address, server, received=b"", told_to_continue=False):
            self.received = received  # what the main thread has read of the connection: the request's head at least
            self.body_left_unread = 0  # bytes of a body not read when the connection is closed (the client may still send)
            self.told_to_continue = told_to_continue  # the main thread said "100 Continue" (Expect: 100-continue)
            self.cut_off = None  # why this request's reply was not delivered whole (for its log line), if it was not
            super().__init__(request, client_address, server)

        def setup(self):
            super().setup()
            self.rfile.close()
            self.rfile = RequestReader(self.received, self.connection, self.timeout)

        def handle_expect_100(self):  # the standard library's "100 Continue", unless the main thread said it: once only
            return True if self.told_to_continue else super().handle_expect_100()

        def handle(self):  # the standard library's loops until the connection closes, holding the worker meanwhile
            self.close_connection = True  # unless the request says keep-alive: then it goes back to the server
            self.handle_one_request()

        # --- logging: one line per request on stderr (not with --quiet), written once it is answered ---
        def handle_one_request(self):
            self.started, self.status, self.body_handled = time.monotonic(), None, False
            self.command, self.path = None, ""  # not the previous request's on this connection, if this one is garbage
            super().handle_one_request()
            if self.status is not None and not args.quiet:
                # the path without its query, and never a header: the token stays out of the log
                path = request_path(self.path) or "-"
                ms = 1000 * (time.monotonic() - self.started)
                cut_off = f" ({self.cut_off}: the reply was not delivered whole)" if self.cut_off else ""
                self.log_message("%s %s %d %.1f ms%s", self.command or "-", path, self.status, ms, cut_off)

        def parse_request(self):
            self.started = time.monotonic()  # the request's time starts when it arrives, not when the connection idles
            if not super().parse_request():
                return False
            if self.request_version == "HTTP/0.9":  # "GET /" alone: its reply would be the body without a status line
                self.send_error(HTTPStatus.BAD_REQUEST, "the request line needs its HTTP version (GET / HTTP/1.1)")
                return False
            # where the body ends is in doubt: a head the standard library read only in part (a line without a colon,
            # or with a space before it, as in "Content-Length : 5": the lines after it are lost), two Content-Lengths
            # that differ (this server reads the first, a proxy in front may read the last), or a chunked body (no
            # endpoint reads one; with a Content-Length too, a proxy in front may read the body the other way).
            # Answered, and the connection closed: what follows cannot be trusted to be where a next request starts
            lengths = {value.strip(" \t") for value in self.headers.get_all("Content-Length", [])}
            if self.headers.defects or len(lengths) > 1 or "Transfer-Encoding" in self.headers:
                self.body_left_unread = MAX_DROPPED  # what the client still sends: the main thread's to drop
                if self.headers.defects:
                    self.send_error(HTTPStatus.BAD_REQUEST, "malformed header line (a name, then a colon at once)")
                elif len(lengths) > 1:
                    self.send_error(HTTPStatus.BAD_REQUEST, "Content-Length given twice, with different values")
                else:
                    message = "Transfer-Encoding is not supported: send the body with a Content-Length"
                    self.send_error(HTTPStatus.NOT_IMPLEMENTED, message)
                return False
            return True

        def send_response(self, code, message=None):
            self.skip_body()  # first: the reply says whether the connection stays open
            self.status = int(code)
            super().send_response(code, message)
            if self.close_connection:  # said, or a keep-alive client would send its next request into a closed socket
                self.send_header("Connection", "close")

        def log_request(self, code="-", size="-"):  # the standard library's line per request: ours is written later
            pass

        def log_error(self, format, *log_args):
            if format.startswith("Request timed out"):  # the standard library's words for a read or a write
                self.cut_off = "timed out"
            # browsers keep idle connections open: their timing out is routine, not an error worth a line in --quiet
            if not (args.quiet and format.startswith("Request timed out")):
                super().log_error(format, *log_args)

        # --- plumbing ---
        def send_json(self, status, payload, headers=None):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":  # a reply to HEAD has headers only
                self.wfile.write(body)

        def send_error(self, code, message=None, explain=None):
            # what the standard library could not parse (request line, headers): JSON too, and the connection closed,
            # as the standard library does, since nothing after it can be trusted to be where a request starts
            self.close_connection = self.body_handled = True
            self.request_version = "HTTP/1.1"  # the request line's own, unless it was unreadable (HTTP/0.9: no status line)
            self.send_json(code, {"error": message or HTTPStatus(code).phrase})

        def send_empty(self, status):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def read_body(self, limit):
            length = self.headers.get("Content-Length")
            length = None if length is None else length.strip(" \t")  # RFC 9110 5.5: not part of the value
            if length is None:
                raise ApiError(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
            if not (length.isascii() and length.isdigit()):
                raise ApiError(HTTPStatus.BAD_REQUEST, "invalid Content-Length")
            if len(length) > 18 or int(length) > limit:  # int() fails on thousands of digits
                self.close_connection = True  # the unread body must not be parsed as the next request
                raise ApiError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body of {length} bytes is over the limit of {limit}")
            self.body_handled = True
            body = self.rfile.read(int(length))
            if len(body) < int(length):  # the client stopped sending (or died) before the end: a clip cut short, a label
                self.close_connection = True  # half-sent, is not what it meant to send
                message = f"the body ended after {len(body)} of the {length} bytes of its Content-Length: nothing stored"
                raise ApiError(HTTPStatus.BAD_REQUEST, message)
            return body

        def skip_body(self):
            """A body no endpoint read (an error came first, or the request takes none) must not be parsed as the next
            request on this keep-alive connection: read and drop it if small, else close the connection."""
            if self.body_handled:
                return
            self.body_handled = True
            length = plain_int(self.headers.get("Content-Length", "0").strip(" \t"))  # as read_body reads it
            if length is None or length > args.max_json_bytes:
                self.close_connection = True
                # what the client still sends of it (all it will send, if its length is unknown) is the server's main
                # thread's to drop, after this reply: closed with bytes unread, the connection would be reset
                self.body_left_unread = (
                    MAX_DROPPED if length is None else min(MAX_DROPPED, max(0, length - len(self.rfile.unread)))
                )
            elif length:
                self.rfile.read(length)

        def read_json(self, limit=None):
            raw = self.read_body(limit or args.max_json_bytes)
            # a browser sends text/plain or a form from any web page without asking the server first; application/json
            # from another page needs the server's consent (a preflight OPTIONS, refused with 403 by check_origin): other
            # pages cannot post
            content_type = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise ApiError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "the body must be sent as Content-Type: application/json")
            too_deep = f"malformed JSON: arrays and objects nested deeper than {MAX_JSON_DEPTH} levels"
            try:
                body = json.loads(raw, parse_constant=reject_non_json_number, parse_float=finite_json_number)
            except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, NaN, Infinity or 1e999
                raise ApiError(HTTPStatus.BAD_REQUEST, f"malformed JSON: {error}") from None
            except RecursionError:  # "[[[[..." within the size limit is deeper than Python's recursion limit
                raise ApiError(HTTPStatus.BAD_REQUEST, too_deep) from None
            if json_depth(body) > MAX_JSON_DEPTH:
                raise ApiError(HTTPStatus.BAD_REQUEST, too_deep)
            try:
                json.dumps(body, ensure_ascii=False).encode()  # a lone surrogate ("\ud800") cannot be stored or sent
            except UnicodeEncodeError:
                raise ApiError(
                    HTTPStatus.BAD_REQUEST, "malformed JSON: a string is not valid Unicode (lone surrogate)"
                ) from None
            if not isinstance(body, dict):
                raise ApiError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
            return body

        def check_origin(self, method, parts):
            """Only this server's own page and programs (no Origin) may use the API: a page of another site open in a
            rater's browser may not write, nor take a pair (a lease, in a name it makes up) or read a rater's figures,
            with any request (the page, the clips and /healthz stay open to all). Bound to this machine, the Host must
            name it too: a page whose DNS name was pointed at 127.0.0.1 (DNS rebinding) sends its own name."""
            host = self.headers.get("Host")
            if host is not None and loopback_only and host_name(host) not in LOOPBACK_NAMES and host != public:
                raise ApiError(HTTPStatus.FORBIDDEN, f"Host {host!r} is not this machine (a page on another site?)")
            if method == "GET" and parts[:1] != ["api"]:
                return
            origin = self.headers.get("Origin")  # a fetch's, and any POST's, from a page
            if origin is not None and origin_host(origin) not in {host, public} - {None}:
                message = f"Origin {origin!r} is another site: only this server's own page may use its API"
                raise ApiError(HTTPStatus.FORBIDDEN, message)
            # browsers say where every request comes from (Fetch Metadata), also those that carry no Origin: an image's,
            # a link's, a GET form's, a no-cors fetch's. "none": typed in, or a bookmark; absent: not a browser
            site = self.headers.get("Sec-Fetch-Site", "none")
            if site not in ("same-origin", "none"):
                message = f"a request from another site's page (Sec-Fetch-Site: {site}): only this server's own page may"
                raise ApiError(HTTPStatus.FORBIDDEN, message + " use its API")

        def rater(self, given):
            """Who is answering: with --rater-keys, the rater whose key the request carries (header X-Rater-Key, or ?key=
            from their link), whatever name it gives; without, the name it gives."""
            if rater_of_key is None:
                return rater_name(given)
            rater = rater_of_key.get(self.headers.get("X-Rater-Key") or self.query.get("key"))
            if rater is None:
                raise ApiError(HTTPStatus.UNAUTHORIZED, "this server knows its raters: open your personal link (/?key=...)")
            return rater

        def require_token(self):
            if args.token and self.headers.get("Authorization") != f"Bearer {args.token}":
                raise ApiError(HTTPStatus.UNAUTHORIZED, "this endpoint needs 'Authorization: Bearer <token>'")

        def route(self, method, parts, query):
            """The endpoint for (method, path parts), as a function to call; None if there is none."""
            match (method, parts):
                case ("GET", [""] | ["index.html"]):
                    return self.page
                case ("GET", ["healthz"]):
                    return lambda: self.send_json(HTTPStatus.OK, {"ok": True, **store.counts()})
                case ("GET", ["clips", clip_id]):
                    return lambda: self.get_clip(clip_id)
                case ("PUT", ["api", "clips", clip_id]):
                    return lambda: self.put_clip(clip_id)
                case ("POST", ["api", "pairs"]):
                    return self.post_pair
                case ("GET", ["api", "pairs", "next"]):
                    return lambda: self.next_pair(query)
                case ("GET", ["api", "pairs", pair_id]):
                    return lambda: self.get_pair(pair_id)
                case ("GET", ["api", "stats"]):
                    return lambda: self.stats(query)
                case ("POST", ["api", "labels"]):
                    return self.post_label
                case ("POST", ["api", "labels", "undo"]):
                    return self.undo_label
                case ("GET", ["api", "labels"]):
                    return lambda: self.get_labels(query)
                case ("POST", ["api", "experiments", experiment, "close"]):
                    return lambda: self.close_experiment(experiment)
                case ("POST", ["api", "experiments", experiment, "keep"]):
                    return lambda: self.keep_open(experiment)
                case ("GET", ["api", "admin"]):
                    return lambda: self.admin()
                case ("GET", ["api", "export"]):
                    return lambda: self.export(query)
                case ("POST", ["api", "import"]):
                    return self.import_answers
            return None  # also /clips/../../etc/passwd: clips live in the database, and no route has a path in it

        def dispatch(self, method):
            try:
                try:
                    self.run_endpoint(method)
                except ApiError as error:  # refused, with its reason (a client gone meanwhile: ConnectionError below)
                    self.send_json(error.status, {"error": error.message}, error.headers)
            except TimeoutError:  # the client went silent mid-request: the standard library logs it and closes
                raise
            except ConnectionError:  # the client went away (a video element dropping a range request, a body cut
                self.close_connection, self.cut_off = True, "the client closed the connection"  # short): nobody to answer
                return
            except Exception:  # a bug must not take the server down: log it, report it, keep serving
                self.log_message("internal error on %s %s, traceback follows", method, request_path(self.path))
                sys.stderr.write(traceback.format_exc())
                if self.status is None:  # what failed, and how, is for the log: not for whoever sent the request
                    message = "internal error (its traceback is in the label server's log)"
                    with contextlib.suppress(ConnectionError):  # (nobody to tell)
                        self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": message})
                else:  # the reply had begun: it cannot be replaced by another, only cut short
                    self.close_connection = True

        def run_endpoint(self, method):
            """Route the request and run its endpoint (an ApiError: the request refused)."""
            try:
                url = urllib.parse.urlsplit(self.path)
            except ValueError:  # e.g. an unclosed IPv6 bracket
                raise ApiError(HTTPStatus.BAD_REQUEST, f"the request target is not a URL: {self.path!r}") from None
            query = self.query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
            self.check_origin(method, parts)
            endpoint = self.route(method, parts, query)
            if endpoint is None:
                allowed = ", ".join(m for m in METHODS if self.route(m, parts, query))
                if not allowed:
                    raise ApiError(HTTPStatus.NOT_FOUND, f"no such endpoint: {method} {url.path}")
                message = f"{method} is not allowed on {url.path}: use {allowed}"
                raise ApiError(HTTPStatus.METHOD_NOT_ALLOWED, message, {"Allow": allowed})
            endpoint()

        def do_GET(self):
            self.dispatch("GET")

        def do_PUT(self):
            self.dispatch("PUT")

        def do_POST(self):
            self.dispatch("POST")

        def __getattr__(self, name):
            # any other method (DELETE, PATCH, HEAD, made-up ones) goes to dispatch for a JSON 405, where the standard
            # library would answer 501 with an HTML page
            if name.startswith("do_"):
                return lambda: self.dispatch(name[3:])
            raise AttributeError(name)

        # --- endpoints ---
        def page(self):
            body = PAGE.encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def put_clip(self, clip_id):
            self.require_token()
            clip_id = require_id(clip_id, "clip_id")
            data = self.read_body(args.max_clip_bytes)
            if not data:
                raise ApiError(HTTPStatus.BAD_REQUEST, "empty clip")
            content_type = sniff_content_type(data, self.headers.get("Content-Type", ""))
            store.put_clip(clip_id, content_type, data)
            self.send_json(HTTPStatus.CREATED, {"clip_id": clip_id, "bytes": len(data), "content_type": content_type})

        def get_clip(self, clip_id):
            clip = store.get_clip(require_id(clip_id, "clip_id"))
            if clip is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"unknown clip: {clip_id}")
            content_type, data = clip
            start, end, status = 0, len(data) - 1, HTTPStatus.OK
            match = re.fullmatch(r"bytes=([0-9]*)-([0-9]*)", self.headers.get("Range", ""))
            if match and (match[1] or match[2]):
                # a number longer than 18 digits (int() refuses thousands) is past the end of any clip
                first, last = (int(n) if len(n) <= 18 else len(data) for n in (match[1] or "0", match[2] or "0"))
                if match[1]:
                    start, end = first, min(last if match[2] else end, end)
                else:  # suffix range: the last N bytes
                    start = max(0, len(data) - last)
                if start > end:
                    message = f"range not satisfiable: the clip has {len(data)} bytes"
                    raise ApiError(
                        HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, message, {"Content-Range": f"bytes */{len(data)}"}
                    )
                status = HTTPStatus.PARTIAL_CONTENT
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Accept-Ranges", "bytes")
            if status == HTTPStatus.PARTIAL_CONTENT:
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Cache-Control", "max-age=3600")
            self.end_headers()
            self.wfile.write(bytes(data[start : end + 1]))

        def post_pair(self):
            self.require_token()
            body = self.read_json()
            golden = body.get("golden")
            if golden is not None and golden not in ("left", "right", "equal"):
                raise ApiError(HTTPStatus.BAD_REQUEST, "'golden' must be 'left', 'right' or 'equal' when given")
            metadata = body.get("metadata", {})
            if not isinstance(metadata, dict):
                raise ApiError(HTTPStatus.BAD_REQUEST, "'metadata' must be a JSON object")
            instruction = body.get("instruction", "Which clip is better?")
            if not isinstance(instruction, str) or not 0 < len(instruction) <= 1000:
                raise ApiError(HTTPStatus.BAD_REQUEST, "'instruction' must be a string of 1-1000 characters")
            if body.get("pair_id") == "next":  # the path GET /api/pairs/next serves a rater's next pair
                raise ApiError(
                    HTTPStatus.BAD_REQUEST, "'pair_id' cannot be 'next': GET /api/pairs/next is a rater's next pair"
                )
            pair = {
                "experiment": require_id(body.get("experiment"), "experiment"),
                "pair_id": require_id(body.get("pair_id"), "pair_id"),
                "left_clip": require_id(body.get("left_clip"), "left_clip"),
                "right_clip": require_id(body.get("right_clip"), "right_clip"),
                "instruction": instruction,
                "metadata": metadata,
                "golden": golden,
            }
            created = store.add_pair(pair)
            self.send_json(HTTPStatus.CREATED if created else HTTPStatus.OK, {"pair_id": pair["pair_id"], "created": created})

        def get_pair(self, pair_id):
            self.require_token()
            pair = store.get_pair(require_id(pair_id, "pair_id"))
            if pair is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"unknown pair: {pair_id}")
            self.send_json(HTTPStatus.OK, pair)

        def stats(self, query):
            rater = self.rater(query.get("rater"))
            self.send_json(HTTPStatus.OK, {"rater": rater, **store.rater_stats(rater)})

        def next_pair(self, query):
            rater = self.rater(query.get("rater"))
            showing = query.get("showing")
            pair = store.next_pair(rater, showing and require_id(showing, "showing"))
            if pair is None:
                self.send_empty(HTTPStatus.NO_CONTENT)
            else:
                self.send_json(HTTPStatus.OK, pair)

        def post_label(self):
            body = self.read_json()
            pair_id = require_id(body.get("pair_id"), "pair_id")
            rater = self.rater(body.get("rater"))
            choice = body.get("choice")
            if choice not in CHOICES:
                raise ApiError(HTTPStatus.BAD_REQUEST, f"'choice' must be one of {', '.join(CHOICES)}")
            new, final = store.add_answer(pair_id, rater, choice)
            status = HTTPStatus.CREATED if new else HTTPStatus.OK
            self.send_json(status, {"pair_id": pair_id, "recorded": new, "duplicate": not new, "final": final})

        def undo_label(self):
            body = self.read_json()
            pair_id = require_id(body.get("pair_id"), "pair_id")
            shown_again = store.undo_answer(pair_id, self.rater(body.get("rater")))
            self.send_json(HTTPStatus.OK, {"pair_id": pair_id, "undone": True, "shown_again": shown_again})

        def get_labels(self, query):
            self.require_token()
            experiment = require_id(query.get("experiment"), "experiment")
            since = plain_int(query.get("since", "0"))
            if since is None:
                raise ApiError(HTTPStatus.BAD_REQUEST, "'since' must be a non-negative integer (at most 18 digits)")
            if since > (last := store.last_label_number()):  # the trainer had it from another database
                message = (
                    f"this label server's database {args.db} never gave label {since} (it has numbered {last} labels): "
                    "is the server running on the run's database (--db, a path relative to where it starts)?"
                )
                raise ApiError(HTTPStatus.CONFLICT, message)
            labels = store.labels_since(experiment, since)
            self.send_json(HTTPStatus.OK, {"labels": labels, "last_seq": labels[-1]["seq"] if labels else since})

        def close_experiment(self, experiment):
            self.require_token()
            experiment = require_id(experiment, "experiment")
            self.send_json(HTTPStatus.OK, {"experiment": experiment, "closed": store.close_experiment(experiment)})

        def keep_open(self, experiment):
            self.require_token()
            experiment = require_id(experiment, "experiment")
            # a resumed run's unanswered pairs, up to its label budget: more than one pair's JSON, so the clips' limit
            pair_ids = self.read_json(args.max_clip_bytes).get("pair_ids")
            if not isinstance(pair_ids, list):
                raise ApiError(HTTPStatus.BAD_REQUEST, "'pair_ids' must be a list of the pair ids still wanted")
            pair_ids = [require_id(pair_id, "each of 'pair_ids'") for pair_id in pair_ids]
            self.send_json(HTTPStatus.OK, {"experiment": experiment, "closed": store.keep_open(experiment, pair_ids)})

        def admin(self):
            self.require_token()
            self.send_json(HTTPStatus.OK, store.summary())

        def export(self, query):
            self.require_token()
            what, form = query.get("what", "labels"), query.get("format", "jsonl")
            if what not in ("answers", "labels", "pairs") or form not in ("jsonl", "csv", "tsv"):
                raise ApiError(HTTPStatus.BAD_REQUEST, "'what' must be answers, labels or pairs; 'format' jsonl, csv or tsv")
            if form == "tsv" and what != "pairs":
                raise ApiError(HTTPStatus.BAD_REQUEST, "format=tsv is the crowd task layout of open pairs: what=pairs")
            experiment = query.get("experiment")
            rows = store.export(what, require_id(experiment, "experiment") if experiment else None)
            if form == "jsonl":
                body, content_type = "".join(json.dumps(row) + "\n" for row in rows), "application/x-ndjson"
            elif form == "csv":
                text = io.StringIO()
                writer = csv.writer(text)
                writer.writerow(rows[0].keys() if rows else [])
                for row in rows:  # metadata and votes as JSON text
                    writer.writerow([json.dumps(v) if isinstance(v, (dict, list)) else v for v in row.values()])
                body, content_type = text.getvalue(), "text/csv; charset=utf-8"
            else:  # a task file for a crowd platform: each pair's two clips as URLs; answers come back via /api/import
                base = query.get("base") or args.public_url or f"http://{self.headers.get('Host', 'localhost')}"
                if not re.fullmatch(r"https?://\S+", base):  # a tab or a line break in it would make rows of its own
                    raise ApiError(HTTPStatus.BAD_REQUEST, f"'base' must be an http(s) URL without spaces (got {base!r})")
                lines = ["INPUT:video1\tINPUT:video2"]
                lines += [
                    f"{base.rstrip('/')}/clips/{row['left_clip']}\t{base.rstrip('/')}/clips/{row['right_clip']}"
                    for row in rows
                ]
                body, content_type = "\n".join(lines) + "\n", "text/tab-separated-values; charset=utf-8"
            data = body.encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Disposition", f'attachment; filename="{experiment or "all"}-{what}.{form}"')
            self.end_headers()
            self.wfile.write(data)

        def import_answers(self):
            """Answers collected elsewhere, as a crowd platform returns them: TSV with INPUT:video1, INPUT:video2 (the
            clips, as URLs or ids) and OUTPUT:result (left, right, equal, cant_tell, or error: the clip did not load,
            kept as cant_tell), optionally ASSIGNMENT:worker_id (the rater, as crowd-<id>). A row without a worker id is
            a rater of its own, crowd-<file>-row<line>, <file> from the file's SHA-256: a row of another file is never
            taken for a duplicate of it. Every row is checked first: one that names no known pair or an unknown result
            rejects the whole file, and nothing is recorded; so does a field that opens a quote closed on a later line.
            Importing the same file again records nothing new."""
            self.require_token()
            body = self.read_body(args.max_clip_bytes)
            try:
                text = body.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise ApiError(HTTPStatus.BAD_REQUEST, "the TSV must be UTF-8") from None
            file_id = hashlib.sha256(body).hexdigest()[:12]
            reader = csv.DictReader(io.StringIO(text), delimiter="\t")
            rows = []  # (the line of the file the row starts on, the row)
            try:
                for row in reader:
                    # a field that starts with a quote (") runs on, over tabs and line ends, to the next quote: the rows
                    # in between would be read into it (a worker's comment), and its row's answer taken for a later
                    # one's. A field over lines with a tab in it is such a runaway (a quoted comment of two lines, not)
                    fields = [v for value in row.values() for v in (value if isinstance(value, list) else [value]) if v]
                    breaks = sum(field.count("\n") for field in fields)
                    rows.append((reader.line_num - breaks, row))
                    if any("\n" in field and "\t" in field for field in fields):
                        raise ApiError(
                            HTTPStatus.BAD_REQUEST,
                            f"nothing imported: lines {reader.line_num - breaks}-{reader.line_num} read as one row: a "
                            'field starts with a quote (") that only a later line closes, and took in the tabs and '
                            "line ends between (a worker's comment?)",
                        )
            except csv.Error as error:  # lines ended by CR alone (old spreadsheets), a field over the csv module's limit
                raise ApiError(HTTPStatus.BAD_REQUEST, f"the TSV cannot be read: {error}") from None
            missing = [c for c in ("INPUT:video1", "INPUT:video2", "OUTPUT:result") if c not in (reader.fieldnames or [])]
            if missing:
                raise ApiError(HTTPStatus.BAD_REQUEST, f"the TSV needs a header row with columns {', '.join(missing)}")
            answers, problems, without_worker_id = [], [], 0
            for number, row in rows:
                result = (row["OUTPUT:result"] or "").strip().lower()
                choice = {"error": "cant_tell"}.get(result, result)
                clips = [clip_id_of(row[c]) for c in ("INPUT:video1", "INPUT:video2")]
                found = store.pair_of_clips(*clips) if all(clips) else None
                worker = (row.get("ASSIGNMENT:worker_id") or "").strip()
                without_worker_id += not worker
                try:
                    rater = rater_name(f"crowd-{worker}" if worker else f"crowd-{file_id}-row{number}")
                except ApiError:
                    rater = None
                if choice not in CHOICES:
                    problems.append(f"line {number}: result {result!r} is not left, right, equal, cant_tell or error")
                elif found is None:
                    problems.append(f"line {number}: no single pair shows the clips {clips[0]} and {clips[1]}")
                elif rater is None:
                    problems.append(f"line {number}: worker id {worker!r} is not a valid rater name")
                else:
                    pair_id, swapped = found
                    answers.append(
                        (pair_id, rater, {"left": "right", "right": "left"}.get(choice, choice) if swapped else choice)
                    )
            if problems:
                more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
                raise ApiError(HTTPStatus.BAD_REQUEST, "nothing imported: " + "; ".join(problems[:10]) + more)
            recorded = sum(store.add_answer(pair_id, rater, choice)[0] for pair_id, rater, choice in answers)
            reply = {"rows": len(rows), "recorded": recorded, "duplicates": len(rows) - recorded}
            self.send_json(HTTPStatus.OK, {**reply, "without_worker_id": without_worker_id, "file": file_id})

    return Handler


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Which clip is better?</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
 body { font-family: system-ui, sans-serif; margin: 0; padding: 0.5em 1em; background: #fafafa; color: #222; }
 #top { display: flex; flex-wrap: wrap; gap: 0.3em 1.5em; align-items: baseline; }
 #status { color: #555; } #notice { color: #a40; font-weight: 600; }
 #instruction { font-size: 1.3em; margin: 0.3em 0; }
 #clips { display: flex; gap: 1.5%; justify-content: center; }
 figure { margin: 0; text-align: center; }
 /* clips, question, buttons and legend fit the window (1280x800, 1366x768 included): no scrolling */
 video, figure img { display: block; height: min(calc(100vh - 12.5em), 48vw); aspect-ratio: 1; background: #000; object-fit: contain; }
 #buttons { display: flex; gap: 0.8em; justify-content: center; margin: 0.4em 0 0.2em; }
 button { font-size: 1.05em; padding: 0.35em 0.9em; } button:disabled { opacity: 0.45; }
 #legend, #hint { text-align: center; color: #555; font-size: 0.9em; min-height: 1.2em; }
 #message { font-size: 1.2em; margin: 2em 0; } .hidden { display: none !important; }
</style></head>
<body>
<div id="top">
 <span>Rater: <input id="rater" size="16"></span> <span id="status"></span>
 <span id="notice"></span> <button id="undo" class="hidden" tabindex="-1"></button>
</div>
<div id="instruction"></div>
<div id="message" class="hidden"></div>
<div id="pair" class="hidden">
 <div id="clips">
  <figure id="left-figure"><video id="left" muted loop playsinline preload="auto"></video><img class="hidden" alt="left clip">
   <figcaption>Left</figcaption></figure>
  <figure id="right-figure"><video id="right" muted loop playsinline preload="auto"></video><img class="hidden" alt="right clip">
   <figcaption>Right</figcaption></figure>
 </div>
 <div id="buttons">
  <button data-choice="left" tabindex="-1">&larr; Left is better</button>
  <button data-choice="equal" tabindex="-1">&uarr; Equally good</button>
  <button data-choice="cant_tell" tabindex="-1">&darr; Can't tell</button>
  <button data-choice="right" tabindex="-1">Right is better &rarr;</button>
 </div>
 <div id="hint"></div>
 <div id="legend">Keys: &larr; left is better, &rarr; right is better, &uarr; equally good, &darr; can't tell<span
  id="undo-keys">; Backspace takes the last answer back</span></div>
</div>
<script>
const $ = (id) => document.getElementById(id);
const left = $("left"), right = $("right"), videos = [left, right];
const images = videos.map((v) => v.parentElement.querySelector("img"));
const NAMES = {left: "Left is better", right: "Right is better", equal: "Equally good", cant_tell: "Can't tell"};
const params = new URLSearchParams(location.search);
// a personal link (/?key=...) from a server started with --rater-keys: the server says who this is
const key = params.get("key"), KEY = key ? {"X-Rater-Key": key} : {};
$("rater").readOnly = Boolean(key);
// the name counts once typed (Enter, or leaving the box), not while it is being typed
let raterName = key ? "" : (params.get("rater") || localStorage.getItem("rater") || "rater-" + Math.random().toString(36).slice(2, 7)).trim();
$("rater").value = raterName;
if (!key) localStorage.setItem("rater", raterName);
let pair = null, busy = false, retry = null, watched = [false, false], lastTime = [0, 0], last = null, undoTimer = null;
let failed = [false, false];  // a clip that neither a video nor an image can show
let refetching = [false, false], playedAgain = [false, false];  // a clip the server did not send; one tried once more
let cutOff = [0, 0];  // how many times each clip of the pair shown broke off midway
function rater() { return key ? $("rater").value.trim() : raterName; }
function show(text) { $("instruction").textContent = ""; $("message").textContent = text; $("message").classList.remove("hidden"); $("pair").classList.add("hidden"); }
function notice(text) { $("notice").textContent = text; }
function status(info) {
  if (key) $("rater").value = info.rater;
  let text = `you have labelled ${info.answered} pairs; ${info.waiting} waiting`;
  if (info.counted === false) text += "; your answers no longer count (too many check pairs answered unlike their known answer)";
  $("status").textContent = text;
}
// an answer counts only once both clips have played through: a rater answers what they watched; a pair with a clip
// that does not load takes only "can't tell" (as a crowd platform's "error" is imported), so no rater is stuck on it
function ready() { return pair !== null && watched[0] && watched[1]; }
function broken() { return pair !== null && (failed[0] || failed[1]); }
function takes(choice) { return ready() || (broken() && choice === "cant_tell"); }  // (a clip seen whole counts)
function brokenHint() {
  const which = failed[0] && failed[1] ? "Neither clip" : failed[0] ? "The left clip" : "The right clip";
  return `${which} did not load: only "Can't tell" (\u2193) is taken for this pair.`;
}
const TRYING = "The label server did not send a clip: trying again...";
function showReady() {
  document.querySelectorAll("button[data-choice]").forEach((b) => { b.disabled = !takes(b.dataset.choice); });
  const hint = $("hint");
  if (ready()) hint.textContent = "";
  else if (broken()) hint.textContent = brokenHint();
  else if (refetching[0] || refetching[1]) hint.textContent = TRYING;
  else if (!hint.textContent || hint.textContent === TRYING) hint.textContent = "Watch both clips to the end, then answer.";
}
// the server takes PNG and GIF clips too (a crowd task's format), which a video cannot play: a clip the video refuses
// is shown as an image, seen once it has loaded (a GIF's loops cannot be followed); one the image refuses too has failed
function clipUrl(i) { return pair && (i ? pair.right_url : pair.left_url); }
videos.forEach((v, i) => v.addEventListener("error", () => {
  if (v.getAttribute("src") !== clipUrl(i) || watched[i]) return;  // an earlier pair's clip, or one seen whole
  if (v.error && v.error.code === MediaError.MEDIA_ERR_NETWORK) { fetchAgain(i); return; }  // cut off while loading
  v.classList.add("hidden"); images[i].classList.remove("hidden"); images[i].src = clipUrl(i);
}));
videos.forEach((v, i) => v.addEventListener("loadeddata", () => {
  if (v.getAttribute("src") === clipUrl(i)) { refetching[i] = false; showReady(); }
}));
images.forEach((img, i) => {
  img.addEventListener("load", () => {
    if (img.getAttribute("src") === clipUrl(i)) { watched[i] = true; refetching[i] = false; showReady(); }
  });
  img.addEventListener("error", () => { if (img.getAttribute("src") === clipUrl(i)) neitherPlaysNorShows(i); });
});
// a request that got no answer fails a video as a broken file does: only a clip the server sends is called broken;
// one it could not send (restarting, the network gone, a proxy's 502-504, a download cut off midway, which the video
// reports as a file it cannot play) is fetched again every 3 s until it comes whole; a clip cut off for the 4th time
// (a limit on the way, not an outage) counts as sent, so the rater is not kept on it for ever. A
// clip the server sends is played once more first (the server may have come back just before it was asked); one it
// sends and no browser can show, or fails on every time (a 500: its own fault), then takes only "can't tell"
async function neitherPlaysNorShows(i) {
  const shown = pair;
  let sent = false;
  try {
    const response = await fetch(clipUrl(i), {headers: KEY, signal: AbortSignal.timeout(20000)});
    sent = ![502, 503, 504].includes(response.status);
    // read whole: a download cut off midway (or stalled for 20 s) throws here, and was not sent
    await response.arrayBuffer().catch(() => { sent = ++cutOff[i] > 3; });
  } catch (error) { /* no answer: not sent */ }
  if (pair !== shown) return;  // another pair by now
  if (!sent) fetchAgain(i);
  else if (!playedAgain[i]) { playedAgain[i] = true; playAgain(i); }
  else { failed[i] = true; showReady(); }
}
function fetchAgain(i) {
  const shown = pair;
  refetching[i] = true; showReady();
  setTimeout(() => { if (pair === shown) playAgain(i); }, 3000);
}
function playAgain(i) {  // the clip as a video again, from the server
  images[i].classList.add("hidden"); images[i].removeAttribute("src"); videos[i].classList.remove("hidden");
  videos[i].load(); videos[i].play().catch(() => {});
}
// the trainers' clips are WebM/VP9: a browser that cannot play them (an old Safari) would see every clip fail
const PLAYABLE = Boolean(left.canPlayType('video/webm; codecs="vp9"'));
// the pair shown is leased to this rater for the server's --lease-seconds, after which another rater may be given it:
// the page renews the lease while the rater is at it (a key, a click, the pointer moving, the tab shown again), so an
// idle tab holds no pair for ever, and it moves on from a pair that needs no more answers: one taken by another rater
// once its lease ran out, or one whose run no longer waits for it (before sending an answer to it, too)
let leasedAt = 0, activeAt = 0, renewing = false;
for (const type of ["keydown", "pointerdown", "pointermove", "wheel", "touchstart"]) {
  document.addEventListener(type, () => { activeAt = performance.now(); }, {capture: true, passive: true});
}
document.addEventListener("visibilitychange", () => { if (!document.hidden) activeAt = performance.now(); });
function leaseAge() { return performance.now() - leasedAt; }
const GONE = "needs no more answers from you (answered already, in another tab or by another rater given it once it had waited past its lease, or its run no longer waits for it)";
setInterval(async () => {  // renewed after half the lease (at most 15 s), if the rater was there since the last time
  if (!pair || busy || renewing || document.hidden || activeAt <= leasedAt) return;
  if (leaseAge() < Math.min(500 * pair.lease_seconds, 15000)) return;
  renewing = true;
  try { await next(pair); } finally { renewing = false; }
}, 500);
let asking = 0;  // the latest call of next(): an earlier one still waiting for the server shows nothing, sets no timer
// the rater's next pair; with `showing` (the pair shown), that pair again while it still needs this rater's answer
// (its lease renewed), kept too if the server does not answer (an answer to it is kept on the page while it is down)
async function next(showing = null) {
  const call = ++asking;
  clearTimeout(retry);
  if (!showing) { pair = null; refetching = [false, false]; showReady(); }
  if (!PLAYABLE) { show("This browser cannot play the clips (WebM video, VP9): open this page in Chrome, Edge or Firefox."); return; }
  try {
    const kept = showing ? "&showing=" + encodeURIComponent(showing.pair_id) : "";
    const response = await fetch("/api/pairs/next?rater=" + encodeURIComponent(rater()) + kept, {headers: KEY});
    if (call !== asking) return;
    if (showing && !response.ok) return;
    if (showing) leasedAt = performance.now();
    if (response.status === 204) {
      if (showing) { notice(`The pair you were shown ${GONE}.`); pair = null; showReady(); }
      const stats = await (await fetch("/api/stats?rater=" + encodeURIComponent(rater()), {headers: KEY})).json();
      if (call !== asking) return;
      status({...stats, waiting: 0});
      show("Nothing to label right now: every pair is answered or with another rater. New pairs appear here as the trainer sends them.");
      retry = setTimeout(next, 3000); return;
    }
    const body = await response.json();
    if (call !== asking) return;
    if (!response.ok) { show("Error: " + body.error); retry = setTimeout(next, 5000); return; }
    leasedAt = performance.now();
    if (showing && body.pair_id === showing.pair_id) { status(body); return; }  // still this rater's
    if (showing) notice(`The pair you were shown ${GONE}.`);
    pair = body;
  } catch (error) {
    if (call !== asking || (showing && pair === showing)) return;  // a renewal that got no answer keeps its pair
    show("The label server is not answering; looking for the next pair again in 3 s..."); retry = setTimeout(next, 3000); return;
  }
  $("instruction").textContent = pair.instruction;
  $("undo-keys").classList.toggle("hidden", !(pair.undo_seconds > 0));
  status(pair);
  $("message").classList.add("hidden"); $("pair").classList.remove("hidden");
  watched = [false, false]; failed = [false, false]; playedAgain = [false, false]; cutOff = [0, 0]; refetching = [false, false];
  $("hint").textContent = ""; showReady();
  images.forEach((img) => { img.classList.add("hidden"); img.removeAttribute("src"); });
  videos.forEach((v) => v.classList.remove("hidden"));
  left.src = pair.left_url; right.src = pair.right_url;
  Promise.all(videos.map((v) => v.play().catch(() => {}))).then(() => {
    left.currentTime = 0; right.currentTime = 0; lastTime = [0, 0];
  });
}
// keep two clips of one length in step (the right one follows the left one's clock; clips of different lengths each
// loop on their own, or pulling the longer one back would count as its loop), and see when each has played through:
// a looping clip's clock reaches its end or wraps round to the start
function sync() {
  const inStep = Math.abs(left.duration - right.duration) < 0.1;
  if (pair && inStep && !left.paused && Math.abs(left.currentTime - right.currentTime) > 0.05) right.currentTime = left.currentTime;
  if (pair) {
    videos.forEach((v, i) => {
      if (v.duration && (v.currentTime >= v.duration - 0.05 || v.currentTime < lastTime[i] - 0.2)) watched[i] = true;
      lastTime[i] = v.currentTime;
    });
    showReady();
  }
  requestAnimationFrame(sync);
}
requestAnimationFrame(sync);
// POST until the server has it (then its reply, else null): while it is down the answer stays on this page, and the
// page says so
async function send(path, body, what) {
  for (let attempt = 0; ; attempt++) {
    try {
      const headers = {"Content-Type": "application/json", ...KEY};
      const response = await fetch(path, {method: "POST", headers: headers, body: JSON.stringify(body)});
      if (response.ok) {
        notice(attempt ? `${what} is saved now.` : "");
        return {...(await response.json().catch(() => ({}))), retried: attempt > 0};
      }
      const error = (await response.json().catch(() => ({}))).error || response.statusText;
      if (response.status < 500) { notice(`${what} was not saved: ${error}`); return null; }
      notice(`${what} is not saved yet (the label server failed: ${error}); it is sent again in 3 s.`);
    } catch (error) {
      notice(`${what} is not saved yet: the label server is not answering. Keep this page open: it is sent again every 3 s.`);
    }
    await new Promise((resolve) => setTimeout(resolve, 3000));
  }
}
async function answer(choice) {
  if (busy || !pair) return;
  if (!takes(choice)) {
    $("hint").textContent = broken() ? brokenHint() : "Watch both clips to the end first: an answer before that is not taken.";
    return;
  }
  busy = true;
  // the name the pair was given to (the box may hold another one by the time the answer is saved)
  const shown = pair, given = {pair_id: pair.pair_id, rater: pair.rater, choice: choice};
  try {
    if (leaseAge() > 900 * shown.lease_seconds) await next(shown);  // its lease may have run out: still this rater's?
    if (pair !== shown) { notice(`Your answer "${NAMES[choice]}" was not sent: the pair you were shown ${GONE}.`); return; }
    const reply = await send("/api/labels", given, `Your answer "${NAMES[choice]}"`);
    // (a duplicate after a retry is this page's own answer, saved by a try whose reply was lost)
    if (reply && reply.duplicate && !reply.retried) notice("You had answered this pair already (in another tab?): your first answer stays.");
    else if (reply) { last = {...given, until: Date.now() + 1000 * shown.undo_seconds}; showUndo(); }
  } finally {
    busy = false;
  }
  if (pair === shown || pair === null) await next();  // (a new name may have been given its pair meanwhile)
}
function showUndo() {
  clearTimeout(undoTimer);
  const remaining = last ? last.until - Date.now() : 0;
  $("undo").classList.toggle("hidden", remaining <= 0);
  if (remaining > 0) {
    $("undo").textContent = `Undo "${NAMES[last.choice]}" (Backspace)`;
    undoTimer = setTimeout(() => { last = null; showUndo(); }, remaining);
  }
}
async function undo() {
  if (busy || !last || Date.now() > last.until) return;
  busy = true;
  const taken = last; last = null; showUndo();
  const undone = await send("/api/labels/undo", {pair_id: taken.pair_id, rater: taken.rater}, "Taking back your answer");
  // the pair again, unless it needs no more answers (another rater's answer made its label, or its run has ended)
  if (undone) notice(`Your answer "${NAMES[taken.choice]}" was taken back: ` +
                     (undone.shown_again ? "this is the pair again." : "that pair needs no more answers."));
  busy = false;
  if (undone) await next();  // the server gives this rater that pair again, if it is open
}
const KEYS = {ArrowLeft: "left", ArrowRight: "right", ArrowUp: "equal", ArrowDown: "cant_tell"};
document.addEventListener("keydown", (event) => {
  if (event.target === $("rater")) return;
  if (event.key === "Backspace") { event.preventDefault(); undo(); return; }
  if (!(event.key in KEYS)) return;
  event.preventDefault();
  if (event.repeat) return;  // a key held down answers one pair, not every pair after it
  answer(KEYS[event.key]);
});
// the buttons never take the focus, so Space or Enter cannot answer the next pair with the last button clicked
document.querySelectorAll("button").forEach((b) => b.addEventListener("mousedown", (event) => event.preventDefault()));
document.querySelectorAll("button[data-choice]").forEach((b) => b.addEventListener("click", () => answer(b.dataset.choice)));
$("undo").addEventListener("click", undo);
$("rater").addEventListener("change", () => {
  if (!key) { raterName = $("rater").value.trim(); localStorage.setItem("rater", raterName); }
  next();
});
$("rater").addEventListener("keydown", (event) => { if (event.key === "Enter") $("rater").blur(); });  // arrows answer again
next();
</script>
</body></html>
"""


CONTENT_LENGTH = re.compile(rb"\ncontent-length[ \t]*:[ \t]*(\d{1,18})[ \t]*\r?\n", re.IGNORECASE)
EXPECT_CONTINUE = re.compile(rb"\nexpect[ \t]*:[ \t]*100-continue", re.IGNORECASE)  # curl, for larger bodies
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"  # to a client that sends its body only once told to go on
HTTP_1_0 = re.compile(rb"[^\n]* HTTP/1\.0\r?\n")  # a request line of HTTP/1.0, which knows no 100 Continue
MAX_HEAD = 65536  # bytes of a request's head (request line and headers): the main thread refuses a longer one (431)
# bytes of a refused request's body (or of the rest of a head too long) that the main thread still receives and drops
# after the refusal, so that a client sending them sees the reply: a connection closed with bytes unread is reset, and
# a client still sending (urllib, which reads the reply only once the whole body is sent) sees the reset, not the reply
MAX_DROPPED = 64 * 1024 * 1024


def end_of_head(received, start):
    """Where the request's head (request line and headers, and the blank line after them) ends in what has been
    received, or None if it has not all arrived. The blank line is looked for from `start` on."""
    ends = [at + len(blank) for blank in (b"\n\r\n", b"\n\n") if (at := received.find(blank, start)) >= 0]
    return min(ends) if ends else None


def body_length(head):
    """The body's length as the head's Content-Length says (0 without one). Only for the main thread to know when the
    request has arrived: the worker parses the head for real, and refuses a malformed one."""
    length = CONTENT_LENGTH.search(head)
    return int(length[1]) if length else 0


class RequestReader:
    """A connection's bytes as a request handler reads them (readline for the head, read for the body): first those
    the server's main thread received, then more from the socket. What is left after the request (a next request,
    sent at once) stays in `unread` and goes back to the main thread with the connection."""

    def __init__(self, received, connection, timeout):
        self.unread, self.connection = bytearray(received), connection
        # what the worker reads itself (a body over the main thread's limit: a clip's) must arrive within `timeout`
        # of the worker taking the request, however it trickles: a timeout per recv, a byte now and then renews
        self.deadline = time.monotonic() + timeout

    def receive(self):
        time_left = self.deadline - time.monotonic()
        if time_left <= 0:
            raise TimeoutError("the request did not arrive whole within --timeout")
        timeout = self.connection.gettimeout()  # the handler's, for writing its reply too: back after this recv
        self.connection.settimeout(time_left)
        try:
            data = self.connection.recv(65536)  # TimeoutError when the time is up
        finally:
            self.connection.settimeout(timeout)
        self.unread += data
        return len(data) > 0

    def take(self, size):
        data = bytes(self.unread[:size])
        del self.unread[:size]
        return data

    def readline(self, limit=-1):
        while b"\n" not in self.unread and (limit < 0 or len(self.unread) < limit) and self.receive():
            pass
        end = self.unread.find(b"\n") + 1 or len(self.unread)
        return self.take(end if limit < 0 else min(end, limit))

    def read(self, size):
        while len(self.unread) < size and self.receive():
            pass
        return self.take(size)

    def close(self):  # the server closes the connection, or keeps it for the next request
        pass


@dataclass
class Waiting:
    """A connection the main thread holds until its next request has arrived."""

    address: tuple
    received: bytearray
    deadline: float  # time.monotonic() when it is closed if its request is not whole by then
    # what has been learnt from `received` so far, so that each recv looks only at what it brought: a request that
    # trickles in a byte per recv costs time in proportion to its length, not to its length squared
    searched: int = 0  # where the search for the blank line after the head goes on from
    head: Optional[bytes] = None  # the request's head, once it has arrived
    body: int = 0  # then the length of its body (Content-Length)
    expects_continue: bool = False  # and whether its client waits to be told to send the body (Expect: 100-continue)
    told_to_continue: bool = False  # said "100 Continue": its client sends the body now
    # refused and answered (a head too long, a body over a limit or that an error came before): this many more bytes
    # it sends are dropped, then it is closed (or when its client closes it, or at its deadline)
    to_drop: int = 0


class Server(HTTPServer):
    """A connection holds a thread only while one of its requests is answered. The main thread accepts connections
    and waits, in one selector, until a request has arrived whole (its head, and its body unless over `body_limit`);
    one of `max_workers` worker threads then answers it and gives a keep-alive connection back to wait for its next
    request. A connection whose request is not whole `timeout` seconds after it began waiting (idle keep-alive, a
    request sent halfway) is closed. So however many connections sit idle or send slowly, a new client is answered
    at once, and waiting costs no CPU. A client that sends its body only once told to (Expect: 100-continue) is told
    by the main thread, which then waits for the body as for any; a head over MAX_HEAD is refused there too. A body
    over `body_limit` is the worker's to read (or refuse), within `timeout` of taking the request. What a client
    still sends of a refused request is received and dropped here (up to MAX_DROPPED bytes, within `timeout`), not by
    a worker, before its connection is closed."""

    request_queue_size = 1024  # the listen backlog, for bursts of new connections (the default is 5)

    def __init__(self, address, handler, max_workers, timeout, body_limit):
        self.waiting = {}  # socket -> Waiting, in the order they began waiting: the first is the first to expire
        self.selector = selectors.DefaultSelector()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET  # --host ::1
        super().__init__(address, handler)  # binds; server_close first where it cannot (a port in use)
        self.request_timeout, self.body_limit = timeout, body_limit
        self.requests = queue.SimpleQueue()  # (socket, address, bytes received, told to continue?) for the workers
        # (socket, address, bytes not read, bytes to drop) of connections a worker is done with: keep-alive ones (0
        # to drop), and refused ones whose client may still be sending (to drop: what is left of the refused body)
        self.given_back = queue.SimpleQueue()
        self.wake_up, self.wake_up_sender = socket.socketpair()  # a worker's byte here wakes the main thread
        for _ in range(max_workers):
            threading.Thread(target=self.work, daemon=True).start()

    def serve(self):
        self.socket.setblocking(False)
        self.wake_up.setblocking(False)
        self.selector.register(self.socket, selectors.EVENT_READ)
        self.selector.register(self.wake_up, selectors.EVENT_READ)
        while True:
            first = next(iter(self.waiting.values()), None)
            timeout = None if first is None else max(0.0, first.deadline - time.monotonic())  # sleeps till then
            for key, _ in self.selector.select(timeout):
                if key.fileobj is self.socket:
                    self.accept()
                elif key.fileobj is self.wake_up:
                    self.take_back()
                else:
                    self.receive(key.fileobj)
            self.close_expired()

    def accept(self):
        while True:  # every connection in the backlog
            try:
                connection, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as error:  # out of file descriptors (EMFILE), or a client that gave up (ECONNABORTED)
                if error.errno not in (errno.EMFILE, errno.ENFILE):
                    return
                if not self.waiting:
                    time.sleep(0.1)  # each one is a worker's: try again soon, without spinning
                    return
                self.close(next(iter(self.waiting)))  # the connection that has waited longest makes room
                continue
            self.wait_for_request(connection, address, b"")

    def wait_for_request(self, connection, address, received):
        connection.setblocking(False)
        self.waiting[connection] = Waiting(address, bytearray(received), time.monotonic() + self.request_timeout)
        self.selector.register(connection, selectors.EVENT_READ)
        self.look_at_request(connection)  # sent at once with the request before, perhaps whole

    def receive(self, connection):
        waiting = self.waiting.get(connection)
        if waiting is None:  # closed earlier in this batch of events, to make room for a new connection (accept)
            return
        try:
            data = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:  # reset by the client
            self.close(connection)
            return
        if waiting.to_drop:  # answered already: what it sends is dropped, then it is closed
            waiting.to_drop -= len(data)
            if not data or waiting.to_drop <= 0:  # closed by the client, or all that it was to send has come
                self.close(connection)
            return
        waiting.received += data
        if not waiting.received:  # closed by the client between requests
            self.close(connection)
        elif not data:  # all the client will send: a worker answers what there is
            self.hand_over(connection)
        else:
            self.look_at_request(connection)

    def look_at_request(self, connection):
        """Hands a connection's request to a worker once whole (its head, and its body unless over `body_limit`: a
        clip's, or one to refuse, is the worker's to read); refuses a head over MAX_HEAD; tells a client that waits to
        be told (Expect: 100-continue) to send its body, which is then waited for here like the rest of any request."""
        waiting = self.waiting[connection]
        if waiting.head is None:
            if waiting.received[:1] in (b"\r", b"\n"):  # RFC 9112 2.2: empty lines before the request line are
                waiting.received = bytearray(waiting.received.lstrip(b"\r\n"))  # ignored (an extra CRLF after a body)
            end = end_of_head(waiting.received, waiting.searched)
            if end is None and len(waiting.received) <= MAX_HEAD:
                # not yet: the next search starts where this one stopped, less the bytes (up to 3, "\n\r\n") of a blank
                # line whose end is still to come
                waiting.searched = max(0, len(waiting.received) - 3)
                return
            if end is None or end > MAX_HEAD:
                self.refuse_head(connection)
                return
            head = waiting.head = bytes(waiting.received[:end])
            waiting.body = body_length(head)
            waiting.expects_continue = bool(EXPECT_CONTINUE.search(head)) and not HTTP_1_0.match(head)
        if waiting.body > self.body_limit or len(waiting.received) - len(waiting.head) >= waiting.body:
            self.hand_over(connection)
        elif waiting.expects_continue and not waiting.told_to_continue:
            self.tell_to_continue(connection)

    def tell_to_continue(self, connection):
        """Says "100 Continue" to a client that sends its body only once told to (curl, for larger bodies)."""
        try:
            sent = connection.send(CONTINUE)
        except OSError:
            sent = 0
        if sent < len(CONTINUE):  # a client that does not read what it is sent (its buffer full), or gone
            self.close(connection)
        else:
            self.waiting[connection].told_to_continue = True

    def refuse_head(self, connection):
        """Answers a request whose head is over MAX_HEAD, whole or not, with a JSON 431, here: no worker waits for the
        rest of it. The connection is closed once the client closes it (or at its deadline, or after MAX_DROPPED
        bytes), its bytes dropped till then: closed with some of them unread, it would be reset, and the reset could
        discard the reply."""
        waiting = self.waiting[connection]
        message = f"request head (request line and headers) over {MAX_HEAD} bytes"
        body = json.dumps({"error": message}).encode()
        reply = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        with contextlib.suppress(OSError):  # gone, or not reading: nothing more to tell it
            connection.send(reply)
            connection.shutdown(socket.SHUT_WR)  # the reply's end: the client's next read sees the connection close
        waiting.received, waiting.to_drop = bytearray(), MAX_DROPPED
        # as the standard library logs a request it refuses (and --quiet keeps)
        when = time.strftime("%d/%b/%Y %H:%M:%S")
        sys.stderr.write(f"{waiting.address[0]} - - [{when}] code 431, message {message}\n")

    def hand_over(self, connection):
        self.selector.unregister(connection)
        waiting = self.waiting.pop(connection)
        self.requests.put((connection, waiting.address, bytes(waiting.received), waiting.told_to_continue))

    def close(self, connection):
        self.selector.unregister(connection)
        del self.waiting[connection]
        connection.close()

    def close_expired(self):
        now = time.monotonic()
        while self.waiting:
            connection, waiting = next(iter(self.waiting.items()))
            if waiting.deadline > now:
                return
            self.close(connection)

    def take_back(self):
        self.wake_up.recv(4096)  # first: a connection given back after this sends another byte
        while True:
            try:
                connection, address, unread, to_drop = self.given_back.get_nowait()
            except queue.Empty:
                return
            if to_drop:
                self.drop_then_close(connection, address, to_drop)
            else:
                self.wait_for_request(connection, address, unread)

    def drop_then_close(self, connection, address, to_drop):
        """Holds a refused connection, its reply sent, until its client has sent the rest of its request (`to_drop`
        bytes, dropped as they come) or closes it, or its deadline."""
        connection.setblocking(False)
        deadline = time.monotonic() + self.request_timeout
        self.waiting[connection] = Waiting(address, bytearray(), deadline, to_drop=to_drop)
        self.selector.register(connection, selectors.EVENT_READ)

    def work(self):
        """A worker thread: answers requests, one at a time."""
        while True:
            connection, address, received, told_to_continue = self.requests.get()
            try:
                handler = self.RequestHandlerClass(connection, address, self, received, told_to_continue)
            except Exception:
                self.handle_error(connection, address)  # a traceback on stderr
                handler = None
            if handler is not None and handler.close_connection and handler.body_left_unread:
                # a refused body that its client may still be sending: the main thread drops it, then closes
                with contextlib.suppress(OSError):  # gone already: the main thread sees it closed
                    connection.shutdown(socket.SHUT_WR)  # the reply's end: the client's next read sees the connection close
                self.given_back.put((connection, address, b"", handler.body_left_unread))
            elif handler is not None and not handler.close_connection:  # keep-alive: its next request is awaited
                self.given_back.put((connection, address, handler.rfile.unread, 0))
            else:
                self.shutdown_request(connection)
                continue
            self.wake_up_sender.send(b"\0")

    def server_close(self):
        super().server_close()
        for connection in self.waiting:
            connection.close()
        self.selector.close()


def main(args: Args) -> None:
    if args.overlap < 1 or args.golden_every < 1 or args.golden_min < 1 or not 0 <= args.golden_threshold <= 1:
        raise SystemExit("error: --overlap, --golden-every and --golden-min must be positive, --golden-threshold in [0, 1]")
    if not (args.lease_seconds > 0 and args.live_seconds > 0 and args.timeout > 0 and args.max_workers > 0):
        raise SystemExit("error: --lease-seconds, --live-seconds, --timeout and --max-workers must be positive")
    if not args.undo_seconds >= 0:
        raise SystemExit("error: --undo-seconds must be 0 or more")
    if not args.timeout <= 86400:  # the server's wait for events (epoll) takes at most about 24 days
        raise SystemExit(f"error: --timeout must be at most 86400 seconds, a day (got {args.timeout})")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"error: --port must be 0-65535, 0 for any free port (got {args.port})")
    if min(args.max_json_bytes, args.max_clip_bytes) < 1024:  # a trainer's pair is about 490 bytes of JSON
        raise SystemExit("error: --max-json-bytes and --max-clip-bytes must be at least 1024")
    if args.public_url and not re.fullmatch(r"https?://[^/\s]+/?", args.public_url):
        raise SystemExit(
            f"error: --public-url must be a scheme and a host, like https://labels.example.org (got {args.public_url})"
        )
    try:
        store = LabelStore(
            args.db,
            args.overlap,
            args.golden_every,
            args.golden_min,
            args.golden_threshold,
            args.lease_seconds,
            args.live_seconds,
            args.undo_seconds,
        )
    except sqlite3.Error as error:
        raise SystemExit(f"error: cannot open the database {args.db}: {error}") from None
    rater_of_key = load_rater_keys(args.rater_keys) if args.rater_keys else None
    try:
        handler = make_handler(store, args, rater_of_key)
        server = Server((args.host, args.port), handler, args.max_workers, args.timeout, args.max_json_bytes)
    except OSError as error:
        raise SystemExit(f"error: cannot listen on {args.host}:{args.port}: {error}") from None
    host, port = server.server_address[:2]
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, as it goes in a URL
    counts = store.counts()
    print(f"label server on http://{host}:{port}/ (database {args.db}: {counts['pairs']} pairs, {counts['labels']} labels)")
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        print("warning: listening beyond this machine without --token: anyone who reaches it can post pairs and read labels")
    sys.stdout.flush()
    for key, rater in (rater_of_key or {}).items():  # on stderr, with the log: the links are as secret as the keys
        base = (args.public_url or f"http://{host}:{port}").rstrip("/")
        print(f"rater {rater}: {base}/?key={urllib.parse.quote(key)}", file=sys.stderr)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main(tyro.cli(Args))
