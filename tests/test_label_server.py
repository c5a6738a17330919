"""label_server.py's HTTP API, against a real server process on a free port: the labelling cycle, idempotency,
overlap with majority vote, golden pairs, the token, bad input, unsupported methods, the server's log, and kill -9
losing nothing acknowledged."""

import csv
import hashlib
import http.client
import io
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import sqlite3
import struct
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import closing, suppress

import label_server as ls
import pytest
from helpers import SERVER

CLIP = b"\x1a\x45\xdf\xa3" + bytes(range(256)) * 4  # a WebM signature and some bytes


def post_pair(server, pair_id, experiment="exp", golden=None, **extra):
    """Upload two clips and post them as a pair; returns the POST's (status, body)."""
    for side in ("l", "r"):
        assert server.call("PUT", f"/api/clips/{pair_id}-{side}", raw=CLIP)[0] == 201
    pair = {"experiment": experiment, "pair_id": pair_id, "left_clip": f"{pair_id}-l", "right_clip": f"{pair_id}-r"}
    if golden:
        pair["golden"] = golden
    return server.call("POST", "/api/pairs", {**pair, **extra})


def answer(server, pair_id, rater, choice):
    return server.call("POST", "/api/labels", {"pair_id": pair_id, "rater": rater, "choice": choice})


def take_back(server, pair_id, rater):
    return server.call("POST", "/api/labels/undo", {"pair_id": pair_id, "rater": rater})


def next_pair(server, rater, showing=None):
    """The pair the server gives `rater` (None for a 204); `showing`: the pair their page shows, to keep if it may."""
    status, body = server.call("GET", f"/api/pairs/next?rater={rater}" + (f"&showing={showing}" if showing else ""))
    assert status in (200, 204), body
    return None if status == 204 else body


def answers_and_label(server, pair_id):
    """A pair's answers as (rater, choice), oldest first, and its label's choice (None before it has one)."""
    pair = server.call("GET", f"/api/pairs/{pair_id}")[1]
    return [(a["rater"], a["choice"]) for a in pair["answers"]], pair["label"] and pair["label"]["choice"]


def label_all(server, rater, golden_choice, choice):
    """The rater answers every pair the server gives them, golden ones (ids "gold...") with `golden_choice`, the others
    with `choice`; the pair ids in the order given."""
    served = []
    while (pair := next_pair(server, rater)) is not None:
        served.append(pair["pair_id"])
        answer(server, pair["pair_id"], rater, golden_choice if pair["pair_id"].startswith("gold") else choice)
    return served


def labels(server, experiment="exp", since=0):
    status, body = server.call("GET", f"/api/labels?experiment={experiment}&since={since}")
    assert status == 200, body
    return body["labels"]


def test_the_whole_labelling_cycle(label_server):
    server = label_server()
    assert server.call("GET", "/healthz") == (200, {"ok": True, "clips": 0, "pairs": 0, "answers": 0, "labels": 0})
    status, body = post_pair(server, "p1", instruction="Which hopper goes faster?", metadata={"left_true_return": 3.5})
    assert (status, body) == (201, {"pair_id": "p1", "created": True})

    pair = next_pair(server, "ann")
    assert pair["pair_id"] == "p1" and pair["instruction"] == "Which hopper goes faster?"
    assert (pair["answered"], pair["waiting"]) == (0, 1)
    assert server.call("GET", pair["left_url"]) == (200, CLIP)  # the clip comes back byte for byte
    assert labels(server) == []  # nothing final before an answer

    status, body = answer(server, "p1", "ann", "right")
    assert status == 201 and body["final"]
    (label,) = labels(server)
    assert label["pair_id"] == "p1" and label["choice"] == "right" and label["metadata"] == {"left_true_return": 3.5}
    assert next_pair(server, "ann") is None  # 204: nothing waiting
    assert server.call("GET", "/api/stats?rater=ann") == (200, {"rater": "ann", "answered": 1, "waiting": 0, "counted": True})

    # polling is incremental: labels after the last sequence number seen
    post_pair(server, "p2")
    answer(server, "p2", "ann", "equal")
    assert [x["pair_id"] for x in labels(server, since=label["seq"])] == ["p2"]
    assert labels(server, experiment="another") == []


def test_labels_asked_after_a_number_this_database_never_gave_are_refused(label_server, tmp_path):
    """A trainer's `since` is the last label number it had from the server: one above any this database ever gave means
    the server runs on another database (an empty one, started from another folder, or a copy from before those
    labels): its pairs are not there, and new labels would be numbered below `since`, never reaching it. Before, the
    reply was "no labels yet", and the trainer waited for ever."""
    server = label_server()
    status, body = server.call("GET", "/api/labels?experiment=exp&since=5")
    assert status == 409 and "never gave label 5" in body["error"] and "0 labels" in body["error"], body
    post_pair(server, "p1")
    answer(server, "p1", "ann", "left")
    (label,) = labels(server, since=0)
    assert labels(server, since=label["seq"]) == []  # the last number it gave: nothing after it yet
    status, body = server.call("GET", f"/api/labels?experiment=exp&since={label['seq'] + 1}")
    assert status == 409 and str(server.db) in body["error"], body
    assert labels(server, experiment="another", since=label["seq"]) == []  # numbers are the server's, not an experiment's


def test_clips_serve_byte_ranges(label_server):
    server = label_server()
    post_pair(server, "p1")
    status, body = server.call("GET", "/clips/p1-l", headers={"Range": "bytes=4-9"})
    assert (status, body) == (206, CLIP[4:10])
    status, body = server.call("GET", "/clips/p1-l", headers={"Range": "bytes=-3"})
    assert (status, body) == (206, CLIP[-3:])
    request = urllib.request.Request(server.url + "/clips/p1-l", headers={"Range": "bytes=4-999999"})
    with urllib.request.urlopen(request, timeout=30) as reply:  # an end past the clip's: up to its last byte
        assert (reply.status, reply.read()) == (206, CLIP[4:])
        assert reply.headers["Content-Range"] == f"bytes 4-{len(CLIP) - 1}/{len(CLIP)}"
        assert reply.headers["Content-Length"] == str(len(CLIP) - 4)
    request = urllib.request.Request(server.url + "/clips/p1-l", headers={"Range": f"bytes={len(CLIP) + 5}-"})
    with pytest.raises(urllib.error.HTTPError, match="416") as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.headers["Content-Range"] == f"bytes */{len(CLIP)}"


def test_posting_and_answering_twice_is_harmless(label_server):
    server = label_server()
    assert post_pair(server, "p1")[0] == 201
    assert post_pair(server, "p1") == (200, {"pair_id": "p1", "created": False})
    assert server.call("GET", "/healthz")[1]["pairs"] == 1
    # the same id with other clips is a conflict, not a silent overwrite
    status, body = server.call(
        "POST", "/api/pairs", {"experiment": "exp", "pair_id": "p1", "left_clip": "p1-r", "right_clip": "p1-l"}
    )
    assert status == 409 and "another left clip (p1-l, not p1-r)" in body["error"], body
    # the same clips under another experiment: the message says what differs
    pair = {"experiment": "exp2", "pair_id": "p1", "left_clip": "p1-l", "right_clip": "p1-r"}
    status, body = server.call("POST", "/api/pairs", pair)
    assert status == 409 and "another experiment (exp, not exp2)" in body["error"] and "clip" not in body["error"], body

    assert answer(server, "p1", "ann", "left")[0] == 201
    status, body = answer(server, "p1", "ann", "right")  # a second answer by the same rater: the first one stays
    assert status == 200 and body["duplicate"]
    assert [x["choice"] for x in labels(server)] == ["left"]
    assert server.call("GET", "/healthz")[1]["answers"] == 1


@pytest.mark.parametrize(
    "votes, expected",
    [
        (["left", "left", "right"], "left"),
        (["right", "cant_tell", "right"], "right"),
        (["left", "right", "equal"], "equal"),
        (["cant_tell", "cant_tell", "left"], "cant_tell"),
        (["left", "right"], "equal"),  # a left/right tie becomes equal
        (["left", "cant_tell"], "left"),
        (["right", "equal"], "equal"),
    ],
)
def test_majority_vote(votes, expected):
    assert ls.majority_vote(votes) == expected


def test_overlap_collects_n_answers_and_publishes_the_majority(label_server):
    server = label_server("--overlap", 3)
    post_pair(server, "p1")
    post_pair(server, "p2")
    for rater, choice in [("ann", "left"), ("bob", "right")]:
        assert answer(server, "p1", rater, choice)[1]["final"] is False
        assert next_pair(server, rater)["pair_id"] == "p2"  # a rater is never shown a pair twice
    assert next_pair(server, "cat")["pair_id"] == "p1"  # still open: it needs a third answer
    assert labels(server) == []
    assert answer(server, "p1", "cat", "left")[1]["final"] is True
    (label,) = labels(server)
    assert (label["choice"], sorted(label["votes"])) == ("left", ["left", "left", "right"])
    assert next_pair(server, "dan")["pair_id"] == "p2"  # p1 is done: nobody else is asked

    server2 = label_server("--overlap", 2, db=server.db + "2")
    post_pair(server2, "p1")
    answer(server2, "p1", "ann", "left")
    answer(server2, "p1", "bob", "right")
    assert [x["choice"] for x in labels(server2)] == ["equal"]


def test_golden_pairs_are_mixed_in_and_exclude_inaccurate_raters(label_server):
    server = label_server("--golden-every", 2, "--golden-min", 2, "--golden-threshold", 0.6)
    for i in range(3):
        post_pair(server, f"gold{i}", golden="left")
    for i in range(4):
        post_pair(server, f"p{i}")

    # one golden pair every second pair while any is left, starting with the first
    assert label_all(server, "good", "left", "right") == ["gold0", "p0", "gold1", "p1", "gold2", "p2", "p3"]
    assert all(x["choice"] == "right" for x in labels(server))  # golden pairs never reach the trainer
    assert {x["pair_id"] for x in labels(server)} == {"p0", "p1", "p2", "p3"}

    # with overlap 2, a rater who fails the golden pairs stops counting: pairs wait for a reliable second answer
    server2 = label_server(
        "--overlap", 2, "--golden-every", 1, "--golden-min", 2, "--golden-threshold", 0.6, db=server.db + "2"
    )
    for i in range(2):
        post_pair(server2, f"gold{i}", golden="left")
    post_pair(server2, "p0")
    label_all(server2, "good", "left", "right")
    assert label_all(server2, "spammer", "right", "left") == ["gold0", "gold1", "p0"]
    assert labels(server2) == []  # the spammer's answer to p0 does not count
    assert next_pair(server2, "third")["pair_id"] == "gold0"
    label_all(server2, "third", "left", "right")
    (label,) = labels(server2)
    assert label["choice"] == "right" and sorted(label["votes"]) == ["right", "right"]


def test_cant_tell_on_a_golden_pair_is_a_miss(label_server):
    """README: a rater's accuracy on golden pairs counts any answer but the known one as a miss, "can't tell" too."""
    server = label_server("--overlap", 2, "--golden-every", 1, "--golden-min", 2, "--golden-threshold", 0.6)
    for i in range(2):
        post_pair(server, f"gold{i}", golden="left")
    post_pair(server, "p0")
    assert label_all(server, "unsure", "cant_tell", "right") == ["gold0", "gold1", "p0"]
    label_all(server, "sure", "left", "right")
    assert labels(server) == []  # the unsure rater's answer to p0 does not count: p0 waits for a second one
    label_all(server, "third", "left", "right")
    (label,) = labels(server)
    assert sorted(label["votes"]) == ["right", "right"]


def test_golden_pairs_wait_their_turn_when_no_other_pair_is_waiting(label_server):
    """Raters who open the page before the trainer has posted (it is still rendering) were given every golden pair back
    to back: none was left to check them once the real pairs came. A golden pair comes once every --golden-every pairs,
    with or without other pairs waiting."""
    server = label_server("--golden-every", 5)
    for i in range(4):
        post_pair(server, f"gold{i}", golden="left")

    assert label_all(server, "ann", "left", "left") == ["gold0"]  # her first pair; then nothing until the trainer posts
    assert server.call("GET", "/api/stats?rater=ann")[1]["waiting"] == 0  # the golden pairs not due are not waiting
    for i in range(6):
        post_pair(server, f"p{i}")
    assert next_pair(server, "ann")["waiting"] == 6  # p0-p5; gold1 is due only after four of them
    assert label_all(server, "ann", "left", "left") == ["p0", "p1", "p2", "p3", "gold1", "p4", "p5"]


def test_taking_back_the_golden_answer_that_made_a_rater_count_again_takes_back_the_labels_it_made(label_server):
    """A rater left out for missing golden pairs gets one right, counts again, and so makes the label of a pair they
    had answered; then takes that golden answer back and is left out again. The label, made of a vote that no longer
    counts, stayed and reached the trainer. It goes (it is as young as the golden answer: not sent), and the pair is
    open again for a rater whose answer counts."""
    server = label_server("--golden-every", 1, "--golden-min", 1, "--golden-threshold", 0.5, "--undo-seconds", 60)
    post_pair(server, "g1", golden="left")
    post_pair(server, "g2", golden="left")
    post_pair(server, "p")
    answer(server, "g1", "xi", "right")  # 0 of 1 golden pairs right: xi's answers are not counted
    answer(server, "p", "xi", "left")
    answer(server, "g2", "xi", "left")  # 1 of 2, at the threshold: counted again, and p is labelled
    assert answers_and_label(server, "p") == ([("xi", "left")], "left")
    assert take_back(server, "g2", "xi")[0] == 200  # 0 of 1 again
    assert answers_and_label(server, "p") == ([("xi", "left")], None)
    for golden in ("g1", "g2"):
        answer(server, golden, "yu", "left")
    assert next_pair(server, "yu")["pair_id"] == "p"  # open again
    answer(server, "p", "yu", "right")
    assert answers_and_label(server, "p") == ([("xi", "left"), ("yu", "right")], "right")


def test_taking_back_a_golden_answer_leaves_the_labels_made_before_it_and_those_sent(tmp_path):
    """Of the labels made with the votes of a rater whom an undone golden answer leaves out again, only those made
    since that answer, and not yet sent to the trainer, go: one made before they were first left out stays (their
    answers counted then), and so does one the trainer was sent (the server restarted with a longer --undo-seconds)."""
    path = str(tmp_path / "golden.sqlite")
    settings = {"golden_every": 1, "golden_min": 1, "golden_threshold": 0.5}
    store = ls.LabelStore(path, **settings, undo_seconds=0.5)
    store.put_clip("c", "video/webm", CLIP)
    pairs = [("g1", "exp", "left"), ("g2", "exp", "left"), ("before", "other", None), ("sent", "exp", None)]
    for pair_id, experiment, golden in [*pairs, ("after", "exp", None)]:
        pair = {"experiment": experiment, "pair_id": pair_id, "left_clip": "c", "right_clip": "c"}
        store.add_pair({**pair, "instruction": "Which?", "metadata": {}, "golden": golden})
    store.add_answer("before", "xi", "left")  # no golden answer yet: counted, labelled (its trainer has not polled)
    store.add_answer("g1", "xi", "right")  # 0 of 1: left out
    store.add_answer("sent", "xi", "left")  # not counted
    store.add_answer("g2", "xi", "left")  # 1 of 2: counted again, and "sent" is labelled
    time.sleep(0.6)
    assert [label["pair_id"] for label in store.labels_since("exp", 0)] == ["sent"]  # its trainer has it
    store.add_answer("after", "xi", "left")  # counted: labelled, not sent
    store.db.close()
    restarted = ls.LabelStore(path, **settings, undo_seconds=60)
    assert restarted.undo_answer("g2", "xi") is True
    assert not restarted.rater_stats("xi")["counted"]
    assert restarted.db.execute("SELECT pair_id FROM labels ORDER BY seq").fetchall() == [("before",), ("sent",)]
    assert restarted.db.execute("SELECT open FROM pairs WHERE pair_id = 'after'").fetchone() == (1,)


@pytest.mark.parametrize("undone_by", ["ABORT", "ROLLBACK"])  # the failed statement, or (as SQLite does) all of it
def test_a_golden_undo_that_fails_part_way_leaves_everything_as_it_was(tmp_path, undone_by):
    """Taking back the golden answer that made a rater count again is three writes: the answer goes, the raters are
    counted again, the labels the rater's votes made since go. Each was committed on its own: a server killed between
    them (or a write that failed, here a trigger standing in for a full disk, after one of two labels went) kept
    labels made of votes that no longer count, with the answer gone, so the undo could not be tried again (404). Now
    all or nothing: after the failure the database and the running server are as before the undo, and the undo can be
    tried again."""
    path = str(tmp_path / "golden.sqlite")
    settings = {"golden_every": 1, "golden_min": 1, "golden_threshold": 0.5, "undo_seconds": 60}
    store = ls.LabelStore(path, **settings)
    store.put_clip("c", "video/webm", CLIP)
    for pair_id, golden in [("g1", "left"), ("g2", "left"), ("p", None), ("p2", None), ("q", None)]:
        pair = {"experiment": "exp", "pair_id": pair_id, "left_clip": "c", "right_clip": "c"}
        store.add_pair({**pair, "instruction": "Which?", "metadata": {}, "golden": golden})
    store.add_answer("g1", "xi", "right")  # 0 of 1 golden pairs right: not counted
    store.add_answer("p", "xi", "left")
    store.add_answer("p2", "xi", "left")
    store.add_answer("g2", "xi", "left")  # 1 of 2: counted again, and p and p2 are labelled

    def answers_and_labelled(db):
        answers = db.execute("SELECT pair_id, rater FROM answers ORDER BY pair_id").fetchall()
        return answers, db.execute("SELECT pair_id FROM labels ORDER BY pair_id").fetchall()

    before = answers_and_labelled(store.db)
    assert before == ([("g1", "xi"), ("g2", "xi"), ("p", "xi"), ("p2", "xi")], [("p",), ("p2",)])
    store.db.execute(  # p's label goes first and its pair opens again (counted in memory), then p2's fails
        "CREATE TEMP TRIGGER disk_full BEFORE DELETE ON labels WHEN OLD.pair_id = 'p2' "
        f"BEGIN SELECT RAISE({undone_by}, 'disk full'); END"
    )
    with pytest.raises(sqlite3.DatabaseError, match="disk full"):
        store.undo_answer("g2", "xi")
    with closing(sqlite3.connect(path)) as other:  # what a restart would find
        assert answers_and_labelled(other) == before
    open_pairs = "SELECT COUNT(*) FROM pairs WHERE open = 1"
    assert store.open_count == store.db.execute(open_pairs).fetchone()[0] == 3  # the golden ones and q
    assert store.rater_stats("xi")["counted"]  # the running server's view too: as before
    store.db.execute("DROP TRIGGER disk_full")
    assert store.undo_answer("g2", "xi") is True  # tried again: done, and p and p2 wait for an answer that counts
    assert answers_and_labelled(store.db) == ([("g1", "xi"), ("p", "xi"), ("p2", "xi")], [])
    assert not store.rater_stats("xi")["counted"] and store.open_count == 5


def test_a_rater_whose_answers_do_not_count_holds_no_pair_back_from_one_whose_do(label_server):
    server = label_server("--golden-min", 1, "--golden-threshold", 0.5)
    post_pair(server, "g1", golden="left")
    post_pair(server, "p1")
    assert next_pair(server, "spam")["pair_id"] == "g1"
    answer(server, "g1", "spam", "right")  # 0 of 1 golden pairs right: spam no longer counts
    assert next_pair(server, "spam")["pair_id"] == "p1"  # leased to spam, whose answer would not make its label
    assert next_pair(server, "good")["pair_id"] == "g1"
    answer(server, "g1", "good", "left")
    pair = next_pair(server, "good")  # before, nothing (204) until spam's lease ran out
    assert pair is not None and pair["pair_id"] == "p1" and pair["counted"], pair
    answer(server, "p1", "good", "right")
    assert [(x["pair_id"], x["choice"]) for x in labels(server)] == [("p1", "right")]


def test_a_pair_whose_answers_count_again_gets_its_label_and_is_served_no_more(label_server, tmp_path):
    """A rater left out for missing golden pairs, who answers a pair and then gets back above the threshold: that
    answer counts again, so the pair has its label as if it had counted all along. It stayed open without one: a
    trainer waiting for it waited for good, and the next rater's answer was wasted (the label was made of the first)."""
    server = label_server("--golden-every", 1, "--golden-min", 1, "--golden-threshold", 0.5)
    post_pair(server, "g1", golden="left")
    post_pair(server, "g2", golden="left")
    post_pair(server, "p")
    answer(server, "g1", "xi", "right")  # 0 of 1 golden pairs right: xi's answers are not counted
    answer(server, "p", "xi", "left")
    assert labels(server) == []
    answer(server, "g2", "xi", "left")  # 1 of 2, at the threshold: counted again
    assert [(x["pair_id"], x["choice"]) for x in labels(server)] == [("p", "left")]
    for golden in ("g1", "g2"):
        answer(server, golden, "yu", "left")
    assert next_pair(server, "yu") is None  # p has its label: no one else is asked

    # the same at a restart whose settings count answers that did not count before: a smaller --overlap
    server.stop()
    db = tmp_path / "restart.sqlite"
    first = label_server("--overlap", 2, db=db)
    post_pair(first, "q")
    answer(first, "q", "ann", "right")
    assert labels(first) == []
    first.stop()
    again = label_server("--overlap", 1, db=db)
    assert [(x["pair_id"], x["choice"]) for x in labels(again)] == [("q", "right")]
    assert next_pair(again, "bob") is None


def test_token_guards_the_trainer_endpoints_only(label_server):
    server = label_server(token="s3cret")
    assert post_pair(server, "p1")[0] == 201  # the helper sends the right token
    for method, path, body in [
        ("PUT", "/api/clips/c9", None),
        ("POST", "/api/pairs", {"experiment": "exp", "pair_id": "p9", "left_clip": "p1-l", "right_clip": "p1-r"}),
        ("GET", "/api/labels?experiment=exp", None),
        ("GET", "/api/pairs/p1", None),
    ]:
        server.token = None
        raw = CLIP if method == "PUT" else None
        assert server.call(method, path, body, raw=raw)[0] == 401
        assert server.call(method, path, body, raw=raw, token="wrong")[0] == 401
        server.token = "s3cret"
    health = server.call("GET", "/healthz")[1]
    assert (health["clips"], health["pairs"]) == (2, 1)  # nothing stored
    server.token = None  # raters need no token: the page, the next pair, clips and answers
    assert server.call("GET", "/")[0] == 200
    assert next_pair(server, "ann")["pair_id"] == "p1"
    assert server.call("GET", "/clips/p1-l")[0] == 200
    assert answer(server, "p1", "ann", "left")[0] == 201
    assert server.call("GET", "/api/labels?experiment=exp", token="s3cret")[1]["labels"][0]["choice"] == "left"


def raw_request(port, data, half_close=False):
    """Send raw bytes over a socket and return the status line and body of the reply; `half_close`: then say that
    nothing more will be sent (a client that stops sending, or dies, before its whole body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


def test_a_client_gone_before_its_error_reply_is_not_logged_as_the_servers_fault(label_server):
    """A client that sends part of its body and closes the connection: the refusal (400, body cut short) found nobody
    to read it, and the broken pipe went into the log as an internal error's traceback, --quiet or not."""
    server = label_server()
    head = b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(head + b'{"pair')
        time.sleep(0.3)
    assert server.call("GET", "/healthz")[0] == 200
    log = server.log(until="GET /healthz 200")
    assert "Traceback" not in log and "internal error" not in log, log


PAIR_P2 = b'{"experiment": "exp", "pair_id": "p2", "left_clip": "p1-l", "right_clip": "p1-r"}'


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("POST", "/api/pairs", b"{not json", 400, "malformed JSON"),
        ("POST", "/api/pairs", b"[1, 2]", 400, "JSON object"),
        ("POST", "/api/pairs", {"experiment": "exp", "pair_id": "p2", "left_clip": "p1-l"}, 400, "right_clip"),
        ("POST", "/api/pairs", {"experiment": "exp", "pair_id": 7, "left_clip": "p1-l", "right_clip": "p1-r"}, 400, "pair_id"),
        ("POST", "/api/pairs", {"experiment": "exp", "pair_id": "p2", "left_clip": "p1-l", "right_clip": "nope"}, 404, "nope"),
        (
            "POST",
            "/api/pairs",
            {"experiment": "e", "pair_id": "../x", "left_clip": "p1-l", "right_clip": "p1-r"},
            400,
            "pair_id",
        ),
        (
            "POST",
            "/api/pairs",
            {"experiment": "e", "pair_id": "p3", "left_clip": "p1-l", "right_clip": "p1-r", "golden": "up"},
            400,
            "golden",
        ),
        # GET /api/pairs/next is a rater's next pair: a pair of that id could never be read back
        ("POST", "/api/pairs", {"experiment": "e", "pair_id": "next", "left_clip": "p1-l", "right_clip": "p1-r"}, 400, "next"),
        ("POST", "/api/labels", {"pair_id": "p1", "rater": "ann", "choice": "up"}, 400, "choice"),
        ("POST", "/api/labels", {"pair_id": "p1", "rater": "ann", "choice": 1}, 400, "choice"),
        ("POST", "/api/labels", {"pair_id": "p1", "choice": "left"}, 400, "rater"),
        ("POST", "/api/labels", {"pair_id": "unknown", "rater": "ann", "choice": "left"}, 404, "unknown pair"),
        ("POST", "/api/labels", {"pair_id": "p1", "rater": "<script>", "choice": "left"}, 400, "rater"),
        ("GET", "/api/pairs/next", None, 400, "rater"),
        ("GET", "/api/labels?experiment=exp&since=-1", None, 400, "since"),
        ("GET", "/api/labels", None, 400, "experiment"),
        ("GET", "/clips/missing", None, 404, "unknown clip"),
        ("GET", "/clips/..%2F..%2Fetc%2Fpasswd", None, 400, "clip_id"),
        ("GET", "/clips/.hidden", None, 400, "clip_id"),
        ("PUT", "/api/clips/a%2Fb", b"x", 400, "clip_id"),
        ("PUT", "/api/clips/empty", b"", 400, "empty clip"),
        ("GET", "/api/nothing", None, 404, "no such endpoint"),
        ("DELETE", "/api/nothing", None, 404, "no such endpoint"),
        ("GET", "/api/labels?experiment=exp&since=99999999999999999999", None, 400, "since"),  # over SQLite's INTEGER
        ("GET", "/api/labels?experiment=exp&since=%C2%B2", None, 400, "since"),  # '²' is a digit to str.isdigit
        ("POST", "/api/pairs", b"[" * 5000, 400, "malformed JSON"),  # nested deeper than Python's recursion limit
        # Python's json reads NaN and Infinity, which are not JSON: served back, they would break the trainer's parser
        ("POST", "/api/pairs", PAIR_P2[:-1] + b', "metadata": {"r": NaN}}', 400, "NaN"),
        ("POST", "/api/pairs", PAIR_P2[:-1] + b', "metadata": {"r": -Infinity}}', 400, "Infinity"),
        ("POST", "/api/pairs", PAIR_P2[:-1] + b', "metadata": {"r": -1e999}}', 400, "1e999"),  # Python reads -inf
        ("POST", "/api/pairs", PAIR_P2[:-1] + b', "instruction": "\\ud800"}', 400, "Unicode"),  # a lone surrogate
        ("POST", "/api/labels", b'{"pair_id": ' + b"7" * 5000 + b', "rater": "ann", "choice": "left"}', 400, "malformed JSON"),
    ],
)
def test_bad_input_gets_a_json_4xx_and_the_server_keeps_serving(label_server, method, path, body, status, message):
    server = label_server()
    post_pair(server, "p1")
    raw = body if isinstance(body, bytes) else None
    got, reply = server.call(method, path, None if raw is not None else body, raw=raw)
    assert got == status and message in reply["error"], reply
    # still serving, nothing changed: the pair and its two clips, no answer
    assert server.call("GET", "/healthz")[1] == {"ok": True, "clips": 2, "pairs": 1, "answers": 0, "labels": 0}


def test_oversized_bodies_path_traversal_and_broken_requests(label_server):
    server = label_server("--max-json-bytes", 1024, "--max-clip-bytes", 5000)
    post_pair(server, "p1")
    status, reply = server.call("POST", "/api/pairs", raw=b"{" + b" " * 2000 + b"}")
    assert status == 413 and "over the limit" in reply["error"]
    assert server.call("PUT", "/api/clips/big", raw=b"\0" * 6000)[0] == 413
    assert server.call("GET", "/clips/big")[0] == 404  # nothing stored
    # the literal path, as curl --path-as-is sends it: never a file of the machine
    line, body = raw_request(
        server.port, b"GET /clips/../../etc/passwd HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert " 404 " in line and b"root:" not in body
    line, body = raw_request(
        server.port, b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\nConnection: close\r\n\r\n"
    )
    assert " 400 " in line and "Content-Length" in json.loads(body)["error"], (line, body)
    line, body = raw_request(server.port, b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert " 411 " in line and "Content-Length" in json.loads(body)["error"], (line, body)
    assert server.call("GET", "/healthz")[0] == 200


@pytest.mark.parametrize(
    "request_line, status",
    [
        (b"GARBAGE", 400),
        (b"GET / HTTP/2.0", 505),
        (b"GET / HTTP/1.x", 400),
        (b"GET /", 400),  # HTTP/0.9, whose replies have no status line
    ],
)
def test_a_broken_request_line_gets_a_status_line_and_a_json_error(label_server, request_line, status):
    server = label_server()
    line, body = raw_request(server.port, request_line + b"\r\n\r\n")
    assert line.startswith(f"HTTP/1.1 {status} "), (line, body)  # a bare body reads as HTTP/0.9 to curl and browsers
    assert json.loads(body)["error"]
    assert server.call("GET", "/healthz")[0] == 200


def test_a_request_target_or_origin_that_is_no_url_gets_a_400_or_403_not_a_crash(label_server):
    """urlsplit raises on an unclosed IPv6 bracket: the request target was answered with a closed connection and the
    Origin header with a 500, each with a traceback in the log."""
    server = label_server()
    line, body = raw_request(
        server.port, b"GET http://[x/api/stats?rater=a HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert line.startswith("HTTP/1.1 400 ") and "request target" in json.loads(body)["error"], (line, body)
    status, reply = server.call("GET", "/api/stats?rater=a", headers={"Origin": "http://[x"})
    assert status == 403 and "Origin" in reply["error"], reply
    assert server.call("GET", "/healthz")[0] == 200
    assert "Traceback" not in server.log()


def test_a_content_length_with_spaces_around_it_is_read(label_server):
    """RFC 9110 5.5: a field value's leading and trailing whitespace is not part of it."""
    server = label_server()
    post_pair(server, "p1")
    body = b'{"pair_id": "p1", "rater": "ann", "choice": "left"}'
    line, _ = raw_request(
        server.port,
        b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)} \r\nConnection: close\r\n\r\n".encode()
        + body,
    )
    assert line.startswith("HTTP/1.1 201 "), line
    assert answers_and_label(server, "p1") == ([("ann", "left")], "left")
    # and a body no endpoint reads (an error came first) is dropped by the same length: the connection serves on
    line, rest = raw_request(
        server.port,
        b"POST /api/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2 \r\n\r\n{}"
        + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert line.startswith("HTTP/1.1 404 ") and b"HTTP/1.1 200 OK" in rest, (line, rest)


def test_empty_lines_before_a_request_line_are_ignored(label_server):
    """RFC 9112 2.2: a server SHOULD ignore at least one empty line before a request line (old clients end a POST body
    with an extra CRLF, which then leads the next request on the connection). The connection was closed unanswered;
    then, with one empty line ignored, two or more (or a bare LF, or empty lines arriving apart) still dropped it."""
    server = label_server()
    post_pair(server, "p1")
    healthz = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    for empty_lines in (b"\r\n", b"\n", b"\r\n\r\n", b"\r\n\n\r\n\r\n"):
        line, body = raw_request(server.port, empty_lines + healthz)
        assert line.startswith("HTTP/1.1 200 ") and json.loads(body)["pairs"] == 1, (empty_lines, line, body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:  # the empty lines come apart
        for part in (b"\r\n", b"\r\n", healthz):
            sock.sendall(part)
            time.sleep(0.2)
        reply = b"".join(iter(lambda: sock.recv(65536), b""))
    assert reply.startswith(b"HTTP/1.1 200 ") and b'"pairs": 1' in reply, reply
    label = b'{"pair_id": "p1", "rater": "ann", "choice": "left"}'
    post = b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    post += b"Content-Length: %d\r\n\r\n%s\r\n" % (len(label), label)  # the extra CRLF after the body
    line, body = raw_request(server.port, post + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert line.startswith("HTTP/1.1 201 ") and body.count(b"HTTP/1.1 200 ") == 1, (line, body)
    assert server.call("GET", "/healthz")[1]["answers"] == 1


@pytest.mark.parametrize(
    "path, content_type, body, declared",
    [
        ("/api/clips/p1-l", "video/webm", CLIP[:200], 200 + 1000),  # a clip sent again: the stored one stays
        ("/api/clips/new", "video/webm", CLIP[:200], 1_000_000),  # over the main thread's limit: the worker reads it
        ("/api/labels", "application/json", b'{"pair_id": "p1", "rater": "ann", "choice": "left"}', 100),
    ],
)
def test_a_body_cut_short_of_its_content_length_is_refused_and_stores_nothing(
    label_server, path, content_type, body, declared
):
    server = label_server()
    post_pair(server, "p1")
    head = f"{'POST' if 'labels' in path else 'PUT'} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += f"Content-Type: {content_type}\r\nContent-Length: {declared}\r\n\r\n"
    line, reply = raw_request(server.port, head.encode() + body, half_close=True)  # the client stops sending
    assert " 400 " in line and f"{len(body)} of the {declared} bytes" in json.loads(reply)["error"], (line, reply)
    assert server.call("GET", "/clips/p1-l") == (200, CLIP)
    assert server.call("GET", "/clips/new")[0] == 404
    assert server.call("GET", "/healthz")[1] == {"ok": True, "clips": 2, "pairs": 1, "answers": 0, "labels": 0}


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, str(SERVER), "--port", str(port), "--db", str(tmp_path / "db.sqlite")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}" in done.stderr and "in use" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--overlap", "0"], "--overlap"),
        (["--golden-threshold", "1.5"], "--golden-threshold"),
        (["--lease-seconds", "0"], "--lease-seconds"),
        (["--undo-seconds", "-1"], "--undo-seconds"),
        (["--timeout", "1e8"], "--timeout"),  # over what the server's wait (epoll) takes: it died at the first request
        (["--timeout", "inf"], "--timeout"),
        (["--port", "70000"], "--port"),  # a traceback (OverflowError from bind)
        (["--port", "-1"], "--port"),
        (["--max-json-bytes", "0"], "--max-json-bytes"),  # started, then refused every pair with 413
        (["--max-clip-bytes", "0"], "--max-clip-bytes"),
        (["--max-json-bytes", "500"], "--max-json-bytes"),  # a trainer's pair is about 490 bytes of JSON, more with metadata
        (["--public-url", "ftp://labels.example.org"], "--public-url"),
    ],
)
def test_settings_the_server_cannot_work_with_are_refused_at_start(tmp_path, flags, message):
    db = tmp_path / "db.sqlite"
    command = [sys.executable, str(SERVER), "--port", "0", "--db", str(db), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and message in done.stderr, done.stderr
    assert not db.exists()  # refused before anything is made


def test_the_server_listens_on_the_ipv6_loopback(label_server):
    with socket.socket(socket.AF_INET6) as probe:
        try:
            probe.bind(("::1", 0))
        except OSError as error:
            pytest.skip(f"this machine has no IPv6 loopback: {error}")
    server = label_server("--host", "::1")
    assert server.url.startswith("http://[::1]:")  # the address as a browser takes it
    assert post_pair(server, "p1")[0] == 201 and server.call("GET", "/clips/p1-l") == (200, CLIP)


def test_kill_9_and_restart_lose_nothing_acknowledged(label_server, tmp_path):
    db = tmp_path / "durable.sqlite"
    server = label_server(db=db)
    acknowledged = {"clips": [], "pairs": [], "answers": []}
    stop = threading.Event()

    def trainer_and_rater():
        """Writes as fast as it can, recording what the server acknowledged, until the server dies."""
        i = 0
        while not stop.is_set():
            try:
                if server.call("PUT", f"/api/clips/c{i}", raw=CLIP)[0] != 201:
                    return
                acknowledged["clips"].append(f"c{i}")
                pair = {"experiment": "exp", "pair_id": f"p{i}", "left_clip": f"c{i}", "right_clip": f"c{i}"}
                if server.call("POST", "/api/pairs", pair)[0] != 201:
                    return
                acknowledged["pairs"].append(f"p{i}")
                if answer(server, f"p{i}", "ann", "left")[0] != 201:
                    return
                acknowledged["answers"].append(f"p{i}")
            except (OSError, http.client.HTTPException):  # refused, reset, or a reply cut off: the server is gone
                return
            i += 1

    writer = threading.Thread(target=trainer_and_rater)
    writer.start()
    while len(acknowledged["answers"]) < 20:
        writer.join(0.05)
    server.kill()  # SIGKILL in the middle of the writes
    stop.set()
    writer.join()

    restarted = label_server(db=db)
    for clip in acknowledged["clips"]:
        assert restarted.call("GET", f"/clips/{clip}") == (200, CLIP)
    final = {x["pair_id"] for x in labels(restarted)}
    assert set(acknowledged["answers"]) <= final
    with sqlite3.connect(db) as check:
        pairs = {row[0] for row in check.execute("SELECT pair_id FROM pairs")}
    assert set(acknowledged["pairs"]) <= pairs
    # and it keeps working where it stopped
    assert post_pair(restarted, "after")[0] == 201 and answer(restarted, "after", "ann", "left")[0] == 201


def test_the_page_is_served_with_the_keys_of_c17(label_server):
    status, page = label_server().call("GET", "/")
    html = page.decode()
    assert status == 200 and "<video" in html
    for key, choice in [("ArrowLeft", "left"), ("ArrowRight", "right"), ("ArrowUp", "equal"), ("ArrowDown", "cant_tell")]:
        assert f'{key}: "{choice}"' in html


@pytest.mark.parametrize(
    "head, status",
    [
        (b"POST /api/labels HTTP/1.1\r\nContent-Length: \xb2", 400),  # '\xb2' is '²' in latin-1: a digit to str.isdigit
        (b"POST /api/labels HTTP/1.1\r\nContent-Length: " + b"9" * 5000, 413),  # too many digits for int()
        (b"GET /clips/p1-l HTTP/1.1\r\nRange: bytes=" + b"9" * 5000 + b"-", 416),  # starts past the clip's end
    ],
)
def test_numbers_python_cannot_convert_are_bad_input_not_a_crash(label_server, head, status):
    server = label_server()
    post_pair(server, "p1")
    line, body = raw_request(server.port, head + b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    assert int(line.split()[1]) == status, line
    assert json.loads(body)["error"], body


# looks like a request: if the server read it as the next one on a keep-alive connection, it would answer it (404)
# in place of the request that really comes next
SMUGGLED = b"GET /api/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"


def healthz_on(connection):
    """GET /healthz on an open keep-alive connection: (status, body)."""
    connection.request("GET", "/healthz")
    reply = connection.getresponse()
    return reply.status, json.loads(reply.read())


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("DELETE", "/api/pairs/p1", "GET"),
        ("PUT", "/api/pairs", "POST"),
        ("PATCH", "/api/labels", "GET, POST"),
        ("OPTIONS", "/", "GET"),
        ("HEAD", "/healthz", "GET"),
        ("BREW", "/api/clips/c1", "PUT"),  # a method nobody has heard of
    ],
)
def test_unsupported_methods_get_a_json_405_with_allow_and_the_server_keeps_serving(label_server, method, path, allow):
    server = label_server()
    post_pair(server, "p1")
    with closing(http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)) as connection:
        connection.request(method, path, body=SMUGGLED)
        reply = connection.getresponse()
        body = reply.read()
        assert reply.status == 405, (reply.status, body)
        assert reply.getheader("Allow") == allow and reply.getheader("Content-Type") == "application/json"
        if method != "HEAD":  # a reply to HEAD has no body
            error = json.loads(body)["error"]
            assert method in error and allow in error, error
        # the same connection (or a new one, if the server closed it) goes on with the next request, not with the body
        assert healthz_on(connection) == (200, {"ok": True, "clips": 2, "pairs": 1, "answers": 0, "labels": 0})


def test_a_body_left_unread_by_an_error_is_never_read_as_the_next_request(label_server):
    server = label_server(token="s3cret")
    with closing(http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)) as connection:
        for method, path, headers, status in [
            ("PUT", "/api/clips/c1", {}, 401),  # refused before the clip is read
            ("PUT", "/api/clips/.c1", {"Authorization": "Bearer s3cret"}, 400),
            ("POST", "/api/nothing", {}, 404),
            ("POST", "/api/labels", {"Content-Length": "-66"}, 400),  # no length to skip the body by
            ("POST", "/api/labels", {"Content-Length": "100000"}, 413),  # too long to read: not read
        ]:
            connection.request(method, path, body=SMUGGLED, headers=headers)
            reply = connection.getresponse()
            reply.read()
            assert reply.status == status
            assert healthz_on(connection)[0] == 200


@pytest.mark.parametrize(
    "headers, body, status",
    [
        (f"Content-Length : {len(SMUGGLED)}", SMUGGLED, 400),  # a space before the colon: not a header to Python
        (f"X-No-Colon\r\nContent-Length: {len(SMUGGLED)}", SMUGGLED, 400),  # Python's parser stops at the bad line
        ("Transfer-Encoding: chunked\r\nContent-Length: 5", b"0\r\n\r\n" + SMUGGLED, 501),  # chunked, the body ends at
        # "0": a proxy in front that reads it so sends SMUGGLED as part of this request, not as one of its own
        (f"Content-Length: 2\r\nContent-Length: {2 + len(SMUGGLED)}", b"{}" + SMUGGLED, 400),  # two lengths: a proxy
        # that reads the last sends SMUGGLED as part of this request (RFC 9112 6.3: refuse)
    ],
)
def test_a_request_whose_body_length_is_in_doubt_is_refused_and_its_connection_closed(label_server, headers, body, status):
    server = label_server()
    head = f"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{headers}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(head.encode() + body)
        replies = b""
        with suppress(TimeoutError):  # a server that keeps the connection open would keep this waiting
            while chunk := sock.recv(65536):
                replies += chunk
    assert replies.startswith(f"HTTP/1.1 {status} ".encode()) and b"Connection: close" in replies, replies
    assert replies.count(b"HTTP/1.1 ") == 1 and b"no such endpoint" not in replies, replies  # nothing more was answered
    assert server.call("GET", "/healthz")[0] == 200


def test_each_request_is_logged_in_one_line_without_secrets(label_server):
    server = label_server(token="s3cret")
    post_pair(server, "p1")  # PUT, PUT, POST
    assert server.call("GET", "/api/pairs/next?rater=ann")[0] == 200
    assert server.call("GET", "/api/nothing")[0] == 404
    expected = [
        ("PUT", "/api/clips/p1-l", 201),
        ("PUT", "/api/clips/p1-r", 201),
        ("POST", "/api/pairs", 201),
        ("GET", "/api/pairs/next", 200),  # without the query
        ("GET", "/api/nothing", 404),
    ]
    for method, path, status in expected:
        log = server.log(until=f" {method} {path} {status} ")
        (line,) = [line for line in log.splitlines() if f" {method} {path} {status} " in line]
        assert re.search(r"\b127\.0\.0\.1\b.* \d+\.\d ms$", line), line  # who asked, and how long it took
    assert len(log.splitlines()) == len(expected), log  # one line per request, nothing else
    assert "s3cret" not in log and "rater=ann" not in log


def test_quiet_logs_no_line_per_request(label_server):
    server = label_server("--quiet")
    with closing(http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)) as connection:
        for method, path in [("GET", "/healthz"), ("GET", "/api/nothing"), ("DELETE", "/healthz"), ("GET", "/")]:
            connection.request(method, path)
            connection.getresponse().read()
    # one connection's requests are served one after the other: the line of each but the last was written before
    # the next was read
    server.stop()
    assert server.log() == ""


@pytest.mark.parametrize("quiet", [False, True])
def test_an_internal_error_answers_500_logs_its_traceback_and_the_server_recovers(label_server, tmp_path, quiet):
    db = tmp_path / "labels.sqlite"
    server = label_server(*(["--quiet"] if quiet else []), db=db)
    # someone holds the database's write lock (an sqlite3 shell in a transaction, a backup) past SQLite's busy timeout
    with closing(sqlite3.connect(db, isolation_level=None)) as other:
        other.execute("BEGIN EXCLUSIVE")
        status, reply = server.call("PUT", "/api/clips/c1", raw=CLIP)
        other.execute("ROLLBACK")
    # the client is told that the server failed, not how: the exception's text is for the log
    assert status == 500 and reply["error"].startswith("internal error") and "locked" not in reply["error"], reply
    log = server.log(until="OperationalError: database is locked")
    assert "PUT /api/clips/c1" in log and "Traceback (most recent call last)" in log, log
    assert "sqlite3.OperationalError: database is locked" in log, log
    # the lock gone, the server serves again, the same request included
    assert server.call("PUT", "/api/clips/c1", raw=CLIP)[0] == 201
    assert server.call("GET", "/healthz")[1]["clips"] == 1
    if not quiet:  # the server writes a request's line just after its reply: wait for it before stopping the server
        server.log(until=" GET /healthz 200 ")
    server.stop()
    assert (" PUT /api/clips/c1 500 " in server.log()) != quiet
    assert (" GET /healthz 200 " in server.log()) != quiet


# --- several raters at once (issue 20): leases instead of lockstep ---


def test_raters_asking_in_turn_get_different_pairs(label_server):
    server = label_server()  # overlap 1
    for i in range(4):
        post_pair(server, f"p{i}")
    served = [next_pair(server, rater)["pair_id"] for rater in ("ann", "bob", "cat")]
    assert served == ["p0", "p1", "p2"]  # each pair leased to the one rater who got it, oldest first
    assert next_pair(server, "dan")["pair_id"] == "p3"
    assert next_pair(server, "eve") is None  # everything is leased: nobody else is sent to a pair already taken
    # an answer ends the lease: a pair that needs no more answers is never handed out again
    answer(server, "p0", "ann", "left")
    assert next_pair(server, "ann") is None and next_pair(server, "eve") is None


def test_at_overlap_2_a_pair_goes_to_two_raters_not_three(label_server):
    server = label_server("--overlap", 2)
    post_pair(server, "p0")
    post_pair(server, "p1")
    assert [next_pair(server, r)["pair_id"] for r in ("ann", "bob", "cat", "dan")] == ["p0", "p0", "p1", "p1"]
    assert next_pair(server, "eve") is None
    # one answer in, one lease still out: the pair needs one more answer and has a rater on it
    answer(server, "p0", "ann", "left")
    assert next_pair(server, "eve") is None
    answer(server, "p0", "bob", "left")
    assert [x["pair_id"] for x in labels(server)] == ["p0"]


def test_an_expired_lease_goes_back_to_the_queue(label_server):
    server = label_server("--lease-seconds", 0.5)
    post_pair(server, "p0")
    assert next_pair(server, "ann")["pair_id"] == "p0"
    assert next_pair(server, "bob") is None  # leased to ann
    time.sleep(0.8)  # ann walked away
    assert next_pair(server, "bob")["pair_id"] == "p0"
    # ann's late answer still counts (the first answers count, leases only decide who is asked)
    assert answer(server, "p0", "ann", "right")[1]["final"] is True
    assert next_pair(server, "cat") is None


def test_a_rater_asking_again_before_answering_gets_the_same_pair(label_server):
    server = label_server("--golden-every", 2)
    post_pair(server, "p0")
    post_pair(server, "p1")
    post_pair(server, "gold0", golden="left")
    first = next_pair(server, "ann")
    assert first["pair_id"] == "gold0"  # a golden pair first, as before
    assert next_pair(server, "ann")["pair_id"] == "gold0"  # a page reload: the same pair, not the next one
    answer(server, "gold0", "ann", "left")
    assert next_pair(server, "ann")["pair_id"] == "p0"
    assert next_pair(server, "ann")["pair_id"] == "p0"
    assert next_pair(server, "bob")["pair_id"] == "gold0"
    assert next_pair(server, "bob")["pair_id"] == "gold0"
    answer(server, "gold0", "bob", "left")
    assert next_pair(server, "bob")["pair_id"] == "p1"  # p0 is ann's


def test_a_page_keeps_the_pair_it_shows_while_that_pair_still_needs_its_raters_answer(label_server):
    """A page renews the lease of the pair it shows (`showing`): the same pair again while it is open, not answered by
    the rater and not taken by others' leases, though its lease ran out; otherwise the rater's next pair, so that the
    page does not keep a pair whose answer would count for nothing (another rater's label, a run that ended)."""
    server = label_server("--lease-seconds", 0.5, "--undo-seconds", 60)
    for pair_id in ("p0", "p1", "p2"):
        post_pair(server, pair_id)
    assert next_pair(server, "ann")["pair_id"] == "p0"
    bobs = next_pair(server, "bob")
    assert bobs["pair_id"] == "p1" and bobs["lease_seconds"] == 0.5  # the page renews before it ends
    time.sleep(0.8)  # both leases ran out; nobody took the pairs meanwhile
    assert next_pair(server, "bob", showing="p1")["pair_id"] == "p1"  # not p0, the oldest pair nobody holds
    assert next_pair(server, "cat")["pair_id"] == "p0"  # bob's lease is back: cat gets ann's old pair
    answer(server, "p0", "cat", "left")  # and its label
    assert next_pair(server, "ann", showing="p0")["pair_id"] == "p2"  # ann's page moves on: p0 needs no answer
    # a pair the rater answered already (in another tab), or one whose run has ended, is not kept either
    answer(server, "p2", "ann", "right")
    assert next_pair(server, "ann", showing="p2") is None  # p1 is bob's
    assert server.call("POST", "/api/experiments/exp/close")[0] == 200
    post_pair(server, "p3")
    post_pair(server, "p4")
    assert next_pair(server, "bob", showing="p1")["pair_id"] == "p3"
    assert next_pair(server, "dan", showing="unknown-pair")["pair_id"] == "p4"  # e.g. a server on another database
    status, body = server.call("GET", "/api/pairs/next?rater=dan&showing=a%20b")
    assert status == 400 and "showing" in body["error"], body
    # the pair an undo leased to the rater comes first: a renewal of the pair shown, on its way during the undo, does
    # not take the lease back (the undone pair went to another rater)
    assert answer(server, "p4", "dan", "left")[0] == 201
    post_pair(server, "p5")
    assert next_pair(server, "dan")["pair_id"] == "p5"
    assert server.call("POST", "/api/labels/undo", {"pair_id": "p4", "rater": "dan"})[1]["shown_again"]
    assert next_pair(server, "dan", showing="p5")["pair_id"] == "p4"


def test_pairs_of_live_experiments_come_first(label_server):
    server = label_server("--live-seconds", 1)
    post_pair(server, "old0", experiment="ended")  # a run that stopped posting and polling
    time.sleep(1.3)
    post_pair(server, "new0", experiment="running")
    assert next_pair(server, "ann")["pair_id"] == "new0"  # newer, but its trainer is still there
    assert next_pair(server, "bob")["pair_id"] == "old0"  # the ended run's pairs are still served, after
    post_pair(server, "old1", experiment="ended")
    time.sleep(1.3)
    labels(server, experiment="ended")  # polling for labels makes an experiment live again
    post_pair(server, "new1", experiment="running")
    assert next_pair(server, "cat")["pair_id"] == "old1"  # both live: oldest first


# --- rater names (issue 20) ---


# ZWNJ joins Persian (and Hindi, ...) names' parts as written: a name typed with it was refused
@pytest.mark.parametrize(
    "name", ["José", "Zoë Müller", "李雷", "o'brien", "ann.b@lab-1", "Ωmega_2", "فاطمه\u200cزهرا", "Col·lell", "Colŀell"]
)
def test_rater_names_may_be_any_letters_and_digits(label_server, name):
    server = label_server()
    post_pair(server, "p1")
    assert next_pair(server, urllib.parse.quote(name))["pair_id"] == "p1"
    assert answer(server, "p1", name, "left")[0] == 201
    status, body = server.call("GET", "/api/stats?rater=" + urllib.parse.quote(name))
    assert status == 200 and {k: body[k] for k in ("answered", "waiting", "counted")} == {
        "answered": 1,
        "waiting": 0,
        "counted": True,
    }


@pytest.mark.parametrize(
    "name", ["", "   ", "<script>", "a\x00b", "a\nb", "a\tb", "x" * 65, "-lead", "a/b", "a\u202eb", "\u200cab", "ab\u200c"]
)
def test_rater_names_with_control_characters_or_markup_are_refused(label_server, name):
    server = label_server()
    post_pair(server, "p1")
    status, body = answer(server, "p1", name, "left")
    assert status == 400 and "rater" in body["error"], body


def test_names_differing_only_by_case_or_spaces_are_one_rater(label_server):
    server = label_server("--overlap", 2)
    post_pair(server, "p1")
    assert answer(server, "p1", "alice", "left")[0] == 201
    for same in ("Alice", "alice ", " ALICE", "Alice\u00a0"):
        status, body = answer(server, "p1", same, "right")
        assert status == 200 and body["duplicate"], (same, body)
    assert server.call("GET", "/healthz")[1]["answers"] == 1
    assert server.call("GET", "/api/stats?rater=ALICE")[1] == {"rater": "alice", "answered": 1, "waiting": 0, "counted": True}
    # composed and decomposed accents are one name too (NFC), and so are their cases
    post_pair(server, "p2")
    assert answer(server, "p2", "Jos\u00e9", "left")[0] == 201
    assert answer(server, "p2", "JOSE\u0301", "left")[1]["duplicate"]
    assert server.call("GET", "/api/pairs/p1")[1]["answers"] == [{"rater": "alice", "choice": "left"}]


# names that look the same are one rater too: one typed with or without the zero-width non-joiner Persian writes
# between a name's parts, in full-width letters (East Asian keyboards) or with a ligature; they were two raters, and
# one person could answer a pair twice
def test_names_that_differ_only_by_joiners_width_or_ligatures_are_one_rater(label_server):
    server = label_server("--overlap", 3)
    post_pair(server, "p1")
    for first, same in (("فاطمه\u200cزهرا", "فاطمهزهرا"), ("alice", "\uff41\uff4c\uff49\uff43\uff45"), ("fiona", "\ufb01ona")):
        assert answer(server, "p1", first, "left")[0] == 201, first
        status, body = answer(server, "p1", same, "right")
        assert status == 200 and body["duplicate"], (same, body)
    assert server.call("GET", "/healthz")[1]["answers"] == 3


# case folding can lengthen a name (ß -> ss, ﬃ -> ffi): 64 ß were stored as 128 letters, a name the server then refused
# when it came back (a lead asking /api/stats for a rater the export names)
def test_the_name_the_server_keeps_for_a_rater_is_itself_accepted(label_server):
    server = label_server()
    for typed in ("Straße", "ß" * 32, "ß" * 64, "\ufb03" * 21, "\ufb03" * 30):
        status, body = server.call("GET", "/api/stats?rater=" + urllib.parse.quote(typed))
        if status == 400:  # refused as it was typed, with the reason
            assert "rater" in body["error"] and len(typed.casefold()) > 64, (typed, body)
            continue
        kept = body["rater"]
        status, again = server.call("GET", "/api/stats?rater=" + urllib.parse.quote(kept))
        assert status == 200 and again["rater"] == kept, (typed, len(kept), again)
    assert server.call("GET", "/api/stats?rater=" + urllib.parse.quote("ß" * 32))[1]["rater"] == "ss" * 32


# --- slow and idle clients (issue 20): timeouts and a bounded number of threads ---


def half_sent(port, data):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    return sock


def test_a_half_sent_request_is_disconnected_after_the_timeout_and_others_are_served(label_server):
    server = label_server("--timeout", 1)
    post_pair(server, "p1")
    started = time.monotonic()
    hanging = [half_sent(server.port, b"GET /heal") for _ in range(5)]  # the request line never ends
    hanging += [  # the headers promise a body that never comes
        half_sent(server.port, b'POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{"pair_id"')
        for _ in range(5)
    ]
    hanging.append(half_sent(server.port, b""))  # connected, never says anything
    assert server.call("GET", "/healthz")[0] == 200  # served while they hang
    for sock in hanging:
        with sock:
            rest = b""
            while chunk := sock.recv(65536):  # the server closes: recv returns b"" (a socket.timeout fails the test)
                rest += chunk
        assert b"HTTP/1.1 200" not in rest
    assert time.monotonic() - started < 5
    assert server.call("GET", "/healthz")[1]["answers"] == 0  # the half-sent answers recorded nothing


def slow_reader(port, request):
    """A connection that has sent `request` and has read nothing yet, its receive buffer fixed small."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting, or the kernel may grow it
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request)
    return sock


def lines_of(server, request, count):
    """The first `count` log lines of `request` ("GET /path"), once written (just after each reply)."""
    deadline = time.monotonic() + 10
    while len(lines := [line for line in server.log().splitlines() if f" {request} " in line]) < count:
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)
    return lines


def test_a_reply_not_delivered_whole_is_logged_as_such(label_server):
    server = label_server("--timeout", 2)
    big = CLIP + bytes(8 * 1024 * 1024)  # more than the socket buffers on both ends hold
    assert server.call("PUT", "/api/clips/big", raw=big)[0] == 201
    request = b"GET /clips/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with closing(slow_reader(server.port, request)):  # never reads its reply
        lines_of(server, "GET /clips/big", 1)
    with closing(slow_reader(server.port, request)) as sock:  # reads its reply's start, then is reset (a closed tab)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert server.call("GET", "/clips/big")[0] == 200  # a client that reads gets it whole
    timed_out, reset, whole = lines_of(server, "GET /clips/big", 3)
    assert timed_out.endswith(" ms (timed out: the reply was not delivered whole)"), timed_out
    assert reset.endswith(" ms (the client closed the connection: the reply was not delivered whole)"), reset
    assert re.search(r" GET /clips/big 200 \d+\.\d ms$", whole), whole


def server_threads(server):
    with open(f"/proc/{server.process.pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_idle_connections_hold_at_most_max_workers_threads(label_server):
    server = label_server("--timeout", 30, "--max-workers", 4)
    idle = [half_sent(server.port, b"") for _ in range(12)]  # e.g. keep-alive connections a browser keeps open
    time.sleep(0.5)
    assert server_threads(server) <= 4 + 1, server_threads(server)  # the workers and the main thread, not one each
    started = time.monotonic()
    # the idle connections wait in the server's main thread, not in a worker: a new request is answered at once (held
    # by workers, they would keep it waiting 30 s, each worker's timeout)
    assert server.call("GET", "/healthz")[0] == 200
    assert time.monotonic() - started < 5
    for sock in idle:
        sock.close()


def cpu_seconds(server):
    """User + system CPU time the server process has used so far."""
    with open(f"/proc/{server.process.pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after "(name)"
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_new_client_is_answered_at_once_while_idle_and_slow_connections_are_held(label_server):
    # 4 workers and the default --timeout (30 s, longer than this test): every kind of connection below is, on its own,
    # as many as the workers or more, and a browser or a slow network holds such connections all the time
    server = label_server("--max-workers", 4)
    kept = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in range(4)]
    for connection in kept:  # keep-alive: one request answered, then idle
        assert healthz_on(connection)[0] == 200
    held = [half_sent(server.port, b"") for _ in range(8)]  # connected, nothing sent
    held += [half_sent(server.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(8)]  # half a head
    held += [  # a whole head, half of its body
        half_sent(server.port, b"POST /api/labels HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{")
        for _ in range(8)
    ]
    time.sleep(0.5)
    cpu_before = cpu_seconds(server)
    time.sleep(1)
    assert cpu_seconds(server) - cpu_before < 0.2  # waiting for them costs no CPU

    started = time.monotonic()
    with closing(http.client.HTTPConnection("127.0.0.1", server.port, timeout=3)) as connection:
        try:
            status = healthz_on(connection)[0]
        except TimeoutError:
            status = "no reply"
    waited = time.monotonic() - started
    assert status == 200 and waited < 1, f"GET /healthz from a new connection: {status} after {waited:.1f} s"

    assert healthz_on(kept[0])[0] == 200  # a kept-alive connection goes on serving
    with closing(socket.create_connection(("127.0.0.1", server.port), timeout=10)) as sock:
        # two requests sent at once on one connection (pipelined): both are answered, in order
        sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\nGET /nothing HTTP/1.1\r\nConnection: close\r\n\r\n")
        replies = b""
        while chunk := sock.recv(65536):
            replies += chunk
    assert re.findall(rb"HTTP/1.1 (\d+)", replies) == [b"200", b"404"]
    for sock in held:
        sock.close()
    for connection in kept:
        connection.close()


def closed_by_server(sock):
    """Has the server closed this connection (nothing left to read, or reset)? Looks without waiting."""
    timeout = sock.gettimeout()
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
    finally:
        sock.settimeout(timeout)


def test_out_of_descriptors_the_oldest_waiting_connection_makes_room_and_the_server_goes_on(label_server):
    server = label_server("--max-workers", 2)
    pid = server.process.pid
    limit = len(os.listdir(f"/proc/{pid}/fd")) + 16
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))  # the server's own limit, lowered from now on
    held = []
    try:
        # idle connections until the server has no descriptor left for the next: it closes the oldest to accept it
        while not any(closed_by_server(sock) for sock in held):
            assert len(held) < 40, "the server never ran out of descriptors"
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            time.sleep(0.05)
        time.sleep(0.3)
        oldest = next(sock for sock in held if not closed_by_server(sock))  # the next one the server closes
        # in one batch of the server's events: a new connection, for which it closes the oldest waiting one, and a
        # byte from that oldest one
        os.kill(pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 5
            while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
                assert time.monotonic() < deadline, "the server did not stop"
                time.sleep(0.01)
            held.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))  # waits in the backlog
            oldest.sendall(b"GET /healthz HTTP/1.1\r\n")
            time.sleep(0.2)
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.5)
        assert server.process.poll() is None, server.log()[-1000:]
        assert server.call("GET", "/healthz")[0] == 200  # at the limit still: the oldest waiting connection makes room
    finally:
        for sock in held:
            sock.close()


def test_a_burst_of_new_connections_waits_in_the_listen_backlog_while_the_server_is_busy(label_server):
    # the server stopped (as if busy) while 300 clients connect: the kernel completes each connection into the listen
    # backlog (1,024; Python's default of 5 would leave all but about 6 hanging); once the server goes on, all are served
    server = label_server()
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    burst = []
    try:
        for _ in range(300):
            burst.append(socket.create_connection(("127.0.0.1", server.port), timeout=2))
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        for sock in burst:
            sock.settimeout(10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        replies = [sock.recv(65536) for sock in burst]
        assert all(reply.startswith(b"HTTP/1.1 200") for reply in replies)
    finally:
        for sock in burst:
            sock.close()


def test_a_body_awaited_after_100_continue_holds_no_worker_and_is_cut_off_after_the_timeout(label_server):
    server = label_server("--max-workers", 2, "--timeout", 2)
    post_pair(server, "p1")
    body = json.dumps({"pair_id": "p1", "rater": "ann", "choice": "left"}).encode()
    # curl's way with a larger body: the head, then the body once the server says "100 Continue"
    head = (
        b"POST /api/labels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\n" % len(body)
    )
    started = time.monotonic()
    told = half_sent(server.port, head + b"Connection: close\r\n\r\n")
    silent = [half_sent(server.port, head + b"\r\n") for _ in range(3)]  # with `told`, twice as many as the workers
    with closing(http.client.HTTPConnection("127.0.0.1", server.port, timeout=1.5)) as connection:
        assert healthz_on(connection)[0] == 200  # at once: no worker waits for their bodies (a TimeoutError fails)
    for sock in [told, *silent]:
        sock.settimeout(2)
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    told.sendall(body)
    reply = b""
    while chunk := told.recv(65536):
        reply += chunk
    told.close()
    assert reply.startswith(b"HTTP/1.1 201 ") and b"100 Continue" not in reply, reply  # told to go on once
    # the others send a byte of their bodies now and then: they are closed `--timeout` after they began waiting
    while not all(closed_by_server(sock) for sock in silent) and time.monotonic() - started < 8:
        for sock in silent:
            with suppress(OSError):
                sock.sendall(b" ")
        time.sleep(0.2)
    waited = time.monotonic() - started
    assert all(closed_by_server(sock) for sock in silent) and waited < 2 + 1.5, f"still open after {waited:.1f} s"
    for sock in silent:
        sock.close()
    assert server.call("GET", "/healthz")[1]["answers"] == 1


def test_a_body_trickling_into_a_worker_is_cut_off_after_the_timeout(label_server):
    server = label_server("--timeout", 2, "--max-json-bytes", 1024, "--max-clip-bytes", 100000, "--quiet")
    # a clip, over the JSON limit: a worker reads its body; a byte every 0.1 s would renew a timeout per recv forever
    sock = half_sent(server.port, b"PUT /api/clips/c1 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 50000\r\n\r\n" + CLIP[:4])
    started = time.monotonic()
    while not closed_by_server(sock) and time.monotonic() - started < 8:
        with suppress(OSError):
            sock.sendall(b"\0")
        time.sleep(0.1)
    waited = time.monotonic() - started
    assert closed_by_server(sock) and waited < 2 + 1.5, f"still open after {waited:.1f} s"
    sock.close()
    assert server.call("GET", "/healthz")[1]["clips"] == 0


def test_a_head_over_64_kib_is_refused_with_431_at_once(label_server):
    server = label_server("--max-workers", 1, "--timeout", 5)
    # lines under the standard library's 64 KiB limit for one line, and no blank line after them: a worker given this
    # head would wait for the rest of it
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 40000 + b"\r\nX-Pad2: " + b"a" * 30000 + b"\r\n"
    unfinished = [half_sent(server.port, head) for _ in range(2)]  # twice as many as the workers
    for sock in unfinished:
        sock.settimeout(2)
        reply = b""
        while chunk := sock.recv(65536):  # the server answers and closes (a TimeoutError fails the test)
            reply += chunk
        sock.close()
        status_line, _, body = reply.partition(b"\r\n\r\n")
        assert status_line.startswith(b"HTTP/1.1 431 ") and "65536 bytes" in json.loads(body)["error"], reply
    line, body = raw_request(server.port, head + b"\r\n")  # whole, but as long
    assert " 431 " in line and "65536 bytes" in json.loads(body)["error"]
    assert server.call("GET", "/healthz")[0] == 200


def upload_clip(server, clip_id, data, token=None):
    """A clip's PUT as the trainers send it (urllib: the whole body first, then the reply is read); its HTTP status.
    A connection closed or reset while the body is being sent raises URLError (and fails the test)."""
    request = urllib.request.Request(
        f"{server.url}/api/clips/{clip_id}", data=data, method="PUT", headers={"Content-Type": "video/webm"}
    )
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_clip_refused_before_its_body_is_read_gets_its_reply_while_still_being_sent(label_server):
    server = label_server("--max-clip-bytes", 100000, "--max-workers", 1, "--quiet", token="s3cret")
    # more than the two sockets' buffers hold: the client is still sending when the server answers
    big = CLIP + b"\0" * 20_000_000
    status, reply = upload_clip(server, "big", big, token="s3cret")
    assert status == 413 and "over the limit of 100000" in reply["error"], reply
    status, reply = upload_clip(server, "big", big, token="wrong")  # refused before its length is even looked at
    assert status == 401 and "Bearer" in reply["error"], reply
    # what is left of those bodies is dropped by the main thread: the one worker answers at once
    started = time.monotonic()
    assert server.call("GET", "/healthz")[1]["clips"] == 0
    assert time.monotonic() - started < 2


def padded_request(head_bytes, body_bytes):
    """A POST whose head (X-Pad headers added) is `head_bytes` long, and its body `body_bytes`."""
    head = b"POST /api/labels HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % body_bytes
    while len(head) < head_bytes - 2:
        head += b"X-Pad: " + b"a" * min(40, head_bytes - len(head) - 11) + b"\r\n"
    return head + b"\r\n" + b" " * body_bytes


def cpu_to_receive_byte_by_byte(server, request, times):
    """CPU seconds (this process's) that `server`'s main-thread code takes to receive `request` `times` times, a byte
    per recv, until it hands the request to a worker."""
    started = time.process_time()
    for _ in range(times):
        client, connection = socket.socketpair()  # a byte sent on it is there to receive at once: one byte per recv
        with client, connection:
            server.wait_for_request(connection, ("client", 0), b"")
            for at in range(len(request)):
                client.send(request[at : at + 1])
                server.receive(connection)
            assert connection not in server.waiting  # whole: handed over
    return time.process_time() - started


def test_a_request_trickled_byte_by_byte_costs_the_main_thread_time_in_proportion_to_its_length():
    # the server's main thread, in this process, without workers (nothing is answered), driven one recv at a time: the
    # same number of bytes and of recvs, in one long request or in 60 short ones, must cost about the same CPU. Seen
    # failing when every recv searched all that had arrived for the end of the head: 11 times as much (2.5 s, 0.22 s)
    server = ls.Server(("127.0.0.1", 0), None, 0, 60, 65536)
    try:
        for head_bytes, body_bytes in [(60000, 0), (30000, 30000)]:  # up to MAX_HEAD, and a body after a long head
            short = cpu_to_receive_byte_by_byte(server, padded_request(head_bytes // 60, body_bytes // 60), 60)
            long = cpu_to_receive_byte_by_byte(server, padded_request(head_bytes, body_bytes), 1)
            assert long < 3 * short, f"{head_bytes} + {body_bytes} bytes: {long:.2f} s of CPU, 60 times 1/60: {short:.2f} s"
    finally:
        server.server_close()


def deep_pair(pair_id, lists):
    """A pair's JSON body whose metadata holds `lists` arrays nested in each other: the body nests 2 + `lists` deep."""
    pair = b'{"experiment": "exp", "pair_id": "%s", "left_clip": "c-l", "right_clip": "c-r", "metadata": {"m": ' % pair_id
    return pair + b"[" * lists + b"]" * lists + b"}}"


def test_json_nested_deeper_than_64_levels_is_refused_and_64_levels_round_trip(label_server):
    server = label_server()
    for clip in ("c-l", "c-r"):
        assert server.call("PUT", f"/api/clips/{clip}", raw=CLIP)[0] == 201
    # 975 arrays deep is within Python's recursion limit when the body is read, not when it is sent back
    for pair_id, lists in [(b"p65", 63), (b"p977", 975)]:
        status, reply = server.call("POST", "/api/pairs", raw=deep_pair(pair_id, lists))
        assert status == 400 and "nested deeper than 64 levels" in reply["error"], (status, reply)
    assert server.call("GET", "/healthz")[1]["pairs"] == 0  # nothing stored
    assert server.call("POST", "/api/pairs", raw=deep_pair(b"p64", 62))[0] == 201
    assert answer(server, "p64", "ann", "left")[0] == 201
    metadata = {"m": json.loads(b"[" * 62 + b"]" * 62)}
    assert server.call("GET", "/api/pairs/p64")[1]["metadata"] == metadata
    assert labels(server)[0]["metadata"] == metadata
    assert json.loads(download(server, "/api/export?what=labels")[1])["metadata"] == metadata


def test_answers_saved_under_older_spellings_of_a_name_join_the_normalised_rater(label_server, tmp_path):
    db = tmp_path / "old.sqlite"
    server = label_server(db=db)
    post_pair(server, "p1")
    post_pair(server, "p2")
    server.stop()
    with closing(sqlite3.connect(db)) as old:  # rows as the server wrote them before names were normalised
        old.executemany(
            "INSERT INTO answers VALUES (?, ?, ?, 0)", [("p1", "Bob", "left"), ("p1", "bob ", "right"), ("p2", "Bob", "left")]
        )
        # and as the server kept non-ASCII names before 0ba4606: NFC case fold, zero-width joiners and full width kept
        old.executemany(
            "INSERT INTO answers VALUES (?, ?, ?, 0)", [("p1", "علی\u200cرضا", "left"), ("p2", "\uff41nn", "left")]
        )
        old.commit()
    restarted = label_server(db=db)
    assert restarted.call("GET", "/api/stats?rater=bob")[1]["answered"] == 2  # not 1 for "Bob" and 1 for "bob "
    assert answer(restarted, "p2", "BOB", "right")[1]["duplicate"]  # the old answer is this rater's
    assert next_pair(restarted, "bob") is None
    for name, pair in (("علیرضا", "p1"), ("ann", "p2")):
        assert restarted.call("GET", "/api/stats?rater=" + urllib.parse.quote(name))[1]["answered"] == 1, name
        assert answer(restarted, pair, name, "right")[1]["duplicate"], name


def test_other_web_pages_open_in_the_raters_browser_can_neither_write_nor_read(label_server):
    server = label_server()
    post_pair(server, "p1")
    vote = {"pair_id": "p1", "rater": "ann", "choice": "left"}
    # what a browser sends from any page without asking the server first: a form's or fetch's text/plain body
    status, reply = server.call("POST", "/api/labels", vote, headers={"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in reply["error"]
    # a JSON request from another page carries that page's Origin
    status, reply = server.call("POST", "/api/labels", vote, headers={"Origin": "http://evil.example"})
    assert status == 403 and "Origin" in reply["error"]
    status, reply = server.call("POST", "/api/labels", vote, headers={"Origin": "null"})  # a sandboxed frame, a file
    assert status == 403
    # DNS rebinding: evil.example's name now points at 127.0.0.1, so its page reads "its own" origin, and names it
    status, reply = server.call("GET", "/api/labels?experiment=exp", headers={"Host": f"evil.example:{server.port}"})
    assert status == 403 and "Host" in reply["error"]
    assert server.call("GET", "/", headers={"Host": "evil.example"})[0] == 403
    assert server.call("GET", "/healthz")[1]["answers"] == 0  # nothing was recorded
    # the rater page itself (same origin, under any loopback name) is served and answers
    assert server.call("GET", "/", headers={"Host": f"localhost:{server.port}"})[0] == 200
    assert server.call("POST", "/api/labels", vote, headers={"Origin": server.url})[0] == 201
    assert server.call("GET", "/healthz")[1]["answers"] == 1


def test_other_web_pages_can_neither_take_a_pair_in_a_raters_browser_nor_read_their_stats(label_server):
    server = label_server()
    post_pair(server, "p1")
    # a fetch from another page carries its Origin; an image, a link, a GET form or a fetch in no-cors mode carry none,
    # but browsers say on every request whose page sent it (Sec-Fetch-Site)
    foreign = [{"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}]
    foreign.append({"Sec-Fetch-Site": "same-site"})  # another port of the same machine, or a sibling subdomain
    for headers in foreign:
        for path in ("/api/pairs/next?rater=mallory", "/api/stats?rater=mallory", "/api/labels?experiment=exp"):
            status, reply = server.call("GET", path, headers=headers)
            assert status == 403 and "another site" in reply["error"], (path, headers, status, reply)
    assert next_pair(server, "ann")["pair_id"] == "p1"  # mallory holds no lease on the one pair
    # the rater page's own requests, and a person typing an address (Sec-Fetch-Site: none), go on
    own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
    assert server.call("GET", "/api/stats?rater=ann", headers=own)[1]["answered"] == 0
    assert server.call("GET", "/api/pairs/next?rater=ann", headers={"Sec-Fetch-Site": "none"})[1]["pair_id"] == "p1"
    # clips stay embeddable in other pages (a crowd platform's task shows them by their URLs)
    assert server.call("GET", "/clips/p1-l", headers={"Sec-Fetch-Site": "cross-site"})[0] == 200


def test_a_trainer_closes_its_experiment_and_its_pairs_are_no_longer_served(label_server, tmp_path):
    db = tmp_path / "closing.sqlite"
    server = label_server(db=db, token="s3cret")
    for pair_id, golden in [("a1", None), ("a2", None), ("ag", "left")]:
        post_pair(server, pair_id, experiment="ended", golden=golden)
    post_pair(server, "b1", experiment="live")
    assert server.call("POST", "/api/experiments/ended/close", token="wrong")[0] == 401
    assert server.call("POST", "/api/experiments/ended/close") == (200, {"experiment": "ended", "closed": 3})
    assert next_pair(server, "ann")["pair_id"] == "b1"  # not the golden pair either
    assert server.call("GET", "/api/stats?rater=ann")[1]["waiting"] == 1
    # an answer to a closed pair (from a page that showed it before) is still recorded and labelled
    assert answer(server, "a1", "bob", "left")[0] == 201
    assert [x["pair_id"] for x in labels(server, "ended")] == ["a1"]
    # closed pairs stay closed across a restart; pairs the experiment posts later are served
    server.stop()
    server = label_server(db=db, token="s3cret")
    assert answer(server, "b1", "ann", "left")[0] == 201
    assert next_pair(server, "ann") is None
    post_pair(server, "a3", experiment="ended")
    assert next_pair(server, "ann")["pair_id"] == "a3"
    assert server.call("POST", "/api/experiments/ended/close")[1]["closed"] == 1
    assert server.call("POST", "/api/experiments/never-posted/close")[1]["closed"] == 0


def test_a_resumed_trainer_keeps_open_only_the_pairs_it_waits_for(label_server, tmp_path):
    db = tmp_path / "keep.sqlite"
    server = label_server("--undo-seconds", 30, db=db, token="s3cret")
    for pair_id, golden in [("a1", None), ("a2", None), ("a3", None), ("ag", "left")]:
        post_pair(server, pair_id, experiment="run", golden=golden)
    post_pair(server, "b1", experiment="other")
    assert answer(server, "a3", "ann", "left")[0] == 201  # labelled, hence closed already
    keep = {"pair_ids": ["a1", "a3", "not-posted-yet"]}
    assert server.call("POST", "/api/experiments/run/keep", keep, token="wrong")[0] == 401
    for bad, message in [({}, "pair_ids"), ({"pair_ids": "a1"}, "pair_ids"), ({"pair_ids": ["../x"]}, "pair_ids")]:
        status, reply = server.call("POST", "/api/experiments/run/keep", bad)
        assert status == 400 and message in reply["error"], reply
    assert server.call("POST", "/api/experiments/run/keep", keep) == (200, {"experiment": "run", "closed": 1})
    # a page that showed a2 before: its answer is recorded, and taking it back does not open a2 again
    assert answer(server, "a2", "dan", "left")[0] == 201
    assert take_back(server, "a2", "dan") == (200, {"pair_id": "a2", "undone": True, "shown_again": False})
    # a2 is no longer served; a1, the golden pair (quality control goes on) and the other experiment's pair are
    served = set()
    while (pair := next_pair(server, "bob")) is not None:
        served.add(pair["pair_id"])
        assert answer(server, pair["pair_id"], "bob", "left")[0] == 201
    assert served == {"a1", "ag", "b1"}
    # the experiment is not ended: a pair it posts later is served, and the closed pair stays closed across a restart
    server.stop()
    server = label_server("--undo-seconds", 30, db=db, token="s3cret")
    post_pair(server, "a4", experiment="run")
    assert next_pair(server, "bob")["pair_id"] == "a4"
    # a keep list longer than one pair's JSON may be (a resumed run waiting for its whole label budget)
    many = {"pair_ids": [f"BreakoutNoFrameskip-v4__rlhf__1__1795796083-abcdef-{i:06d}" for i in range(3300)]}
    assert len(json.dumps(many)) > 64 * 1024
    assert server.call("POST", "/api/experiments/run/keep", many)[1]["closed"] == 1  # a4


def test_a_database_from_before_closing_serves_only_its_unlabelled_pairs(label_server, tmp_path):
    db = tmp_path / "old.sqlite"
    with closing(sqlite3.connect(db)) as old:  # the tables as servers before the `open` column (and labels' raters) made them
        old.executescript(ls.SCHEMA.replace(", raters TEXT", ""))
        old.execute("INSERT INTO clips VALUES ('c', 'video/webm', ?, 0)", (CLIP,))
        for i in (1, 2, 3):
            old.execute("INSERT INTO pairs VALUES (?, 'exp', 'c', 'c', 'Which?', '{}', NULL, ?)", (f"p{i}", i))
        old.execute("INSERT INTO answers VALUES ('p1', 'ann', 'left', 0)")
        old.execute("INSERT INTO labels (pair_id, experiment, choice, votes, created) VALUES ('p1', 'exp', 'left', '[]', 0)")
        old.commit()
    server = label_server(db=db)
    pair = next_pair(server, "bob")
    assert (pair["pair_id"], pair["waiting"]) == ("p2", 2)
    assert [x["pair_id"] for x in labels(server)] == ["p1"]
    assert answer(server, "p2", "bob", "left")[0] == 201  # a label made now records its raters
    assert [x["pair_id"] for x in labels(server)] == ["p1", "p2"]


def test_the_queue_is_walked_through_indexes_never_scanned(tmp_path):
    """What keeps `next` fast with 100k pairs (benchmark/label_server_queue.py): every query of handing out a pair,
    answering it, counting a rater's queue and closing an experiment searches an index; none reads a whole table."""
    store = ls.LabelStore(str(tmp_path / "queue.sqlite"), overlap=2)
    store.put_clip("c", "video/webm", CLIP)
    for i in range(30):
        golden = "left" if i % 10 == 0 else None
        pair = {"experiment": f"e{i % 3}", "pair_id": f"p{i}", "left_clip": "c", "right_clip": "c"}
        store.add_pair({**pair, "instruction": "Which?", "metadata": {}, "golden": golden})
    store.add_answer("p1", "ann", "left")
    store.next_pair("cid")  # a lease held by another rater
    statements = []
    store.db.set_trace_callback(statements.append)
    for rater in ("ann", "bob"):
        pair = store.next_pair(rater)
        store.rater_stats(rater)
        store.add_answer(pair["pair_id"], rater, "left")
    store.add_answer("p0", "bob", "left")  # a golden pair
    store.close_experiment("e1")
    store.labels_since("e0", 0)
    store.db.set_trace_callback(None)
    queries = [s for s in statements if s.lstrip().startswith(("SELECT", "UPDATE"))]
    assert len(queries) > 10
    for sql in queries:
        plan = [row[3] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql)]
        assert not any(step.startswith("SCAN") for step in plan), (sql, plan)


def test_a_pair_being_answered_is_never_free_for_another_rater_at_overlap_1(tmp_path):
    """README: at overlap 1 each rater gets a different pair and no answer is wasted. Answering dropped the rater's
    lease, then waited for the database to record the answer: while the database was busy (a clip upload, another
    rater), the pair was neither leased nor answered, and another rater's `next` could take it and answer it for
    nothing (benchmark/README.md: 28-41 of 600 answers wasted). Here the database is held busy while Alice answers;
    whenever `next` could look at the leases, Alice's pair is still hers or already answered, and Bob gets the other."""
    store = ls.LabelStore(str(tmp_path / "race.sqlite"), overlap=1)
    store.put_clip("c", "video/webm", CLIP)
    for pair_id in ("p0", "p1"):
        pair = {"experiment": "e", "pair_id": pair_id, "left_clip": "c", "right_clip": "c", "instruction": "Which?"}
        store.add_pair(pair | {"metadata": {}, "golden": None})
    assert store.next_pair("alice")["pair_id"] == "p0"
    alice = threading.Thread(target=store.add_answer, args=("p0", "alice", "left"))
    with store.lock:  # the database busy (a clip being written)
        alice.start()
        end = time.monotonic() + 2  # Alice's answer under way, waiting for the database (it dropped her lease first)
        while time.monotonic() < end and "alice" in store.lease_of:
            time.sleep(0.01)
        if store.lease_lock.acquire(timeout=0.5):  # what `next` would see of the leases now
            try:
                answered = store.db.execute("SELECT COUNT(*) FROM answers WHERE pair_id = 'p0'").fetchone()[0]
                assert store.lease_of.get("alice", (None,))[0] == "p0" or answered, "p0: neither leased nor answered"
            finally:
                store.lease_lock.release()
    alice.join(10)
    assert store.next_pair("bob")["pair_id"] == "p1"
    assert store.get_pair("p0")["answers"] == [{"rater": "alice", "choice": "left"}]


TRAINER_CALLS = {  # what a trainer's request does to the experiments marked as still wanted -> the marks after it
    "polls labels": (lambda store: store.labels_since("new", 0), ["old1", "old2", "new"]),
    "posts a pair": (
        lambda store: store.add_pair(
            {"experiment": "new", "pair_id": "p", "left_clip": "c", "right_clip": "c", "instruction": "Which?"}
            | {"metadata": {}, "golden": None}
        ),
        ["old1", "old2", "new"],
    ),
    "closes its run": (lambda store: store.close_experiment("old2"), ["old1"]),
}


@pytest.mark.parametrize("trainer_call", TRAINER_CALLS)
def test_a_trainer_request_while_a_rater_gets_a_pair_never_breaks_either(tmp_path, trainer_call):
    """A trainer's request marks its experiment as still wanted (or, at its run's end, no longer); a rater's `next`
    walks those marks to put live experiments first. The two run in different request threads: a trainer's request
    in the middle of that walk must not break the rater's (a 500, "dictionary changed size during iteration"). The
    marks here pause their walk after the first one while the trainer's request runs (0.2 s at most): the moment such a
    request would land inside the walk, made to happen every time."""
    call, marks_after = TRAINER_CALLS[trainer_call]
    store = ls.LabelStore(str(tmp_path / "seen.sqlite"), live_seconds=0.0)  # no experiment live: no pair served
    store.put_clip("c", "video/webm", CLIP)
    trainer = threading.Thread(target=call, args=(store,))
    waiting_mid_walk = []

    class MarksThatPauseMidWalk(dict):
        def items(self):
            walk = iter(dict.items(self))
            yield next(walk)
            trainer.start()
            trainer.join(0.2)
            waiting_mid_walk.append(trainer.is_alive())
            yield from walk

    store.seen = MarksThatPauseMidWalk(old1=0.0, old2=0.0)
    try:
        assert store.next_pair("ann") is None
    finally:
        if trainer.ident is not None:  # started by the walk
            trainer.join()
    assert waiting_mid_walk == [True]  # the trainer's request waited for the walk to end...
    assert list(store.seen) == marks_after  # ...and was not lost


def download(server, path, token=None):
    """(status, text) of a GET whose reply is not one JSON document (JSON lines, CSV, TSV)."""
    request = urllib.request.Request(server.url + path, headers={"Authorization": f"Bearer {token or server.token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_admin_summary_shows_queues_golden_accuracy_and_agreement(label_server):
    server = label_server("--overlap", 2, token="s3cret")
    post_pair(server, "g1", golden="left")
    post_pair(server, "p1")
    post_pair(server, "p2")
    post_pair(server, "q1", experiment="other")
    for pair_id, ann, bob in [("g1", "left", "right"), ("p1", "left", "left"), ("p2", "left", "right")]:
        answer(server, pair_id, "ann", ann)
        answer(server, pair_id, "bob", bob)
    assert server.call("GET", "/api/admin", token="wrong")[0] == 401
    status, summary = server.call("GET", "/api/admin")
    assert status == 200
    experiments = {e["experiment"]: e for e in summary["experiments"]}
    assert {k: experiments["exp"][k] for k in ("pairs", "open", "labels", "live")} == {
        "pairs": 3,
        "open": 1,  # the golden pair: every rater answers it
        "labels": 2,
        "live": True,
    }
    assert (experiments["other"]["open"], experiments["other"]["labels"]) == (1, 0)
    assert 0 <= experiments["other"]["oldest_open_seconds"] < 60
    raters = {r["rater"]: r for r in summary["raters"]}
    # they agreed on one pair of three
    assert raters["ann"] == {
        "rater": "ann",
        "answers": 3,
        "golden_answered": 1,
        "golden_accuracy": 1.0,
        "excluded": False,
        "agreement": 0.333,
    }
    assert (raters["bob"]["golden_accuracy"], raters["bob"]["agreement"]) == (0.0, 0.333)
    assert summary["agreement"] == 0.333


def test_the_admin_summary_gives_each_experiment_its_own_answers_agreement_and_golden_accuracy(label_server):
    server = label_server("--overlap", 2, token="s3cret")
    post_pair(server, "ga", experiment="a", golden="left")
    post_pair(server, "a1", experiment="a")
    post_pair(server, "a2", experiment="a")
    post_pair(server, "gb", experiment="b", golden="right")
    post_pair(server, "b1", experiment="b")
    post_pair(server, "c1", experiment="c")  # no answers yet
    # in a, ann and bob answer the golden pair right and agree on two pairs of three; in b, ann answers the golden pair
    # wrong and disagrees with everyone, cid answers only the golden pair
    for pair_id, rater, choice in [
        ("ga", "ann", "left"), ("ga", "bob", "left"), ("a1", "ann", "left"), ("a1", "bob", "left"),
        ("a2", "ann", "left"), ("a2", "bob", "right"),
        ("gb", "ann", "left"), ("gb", "bob", "right"), ("gb", "cid", "right"), ("b1", "ann", "right"), ("b1", "bob", "left"),
    ]:  # fmt: skip
        assert answer(server, pair_id, rater, choice)[0] == 201
    summary = server.call("GET", "/api/admin")[1]
    experiments = {e["experiment"]: e for e in summary["experiments"]}

    keys = ("answers", "golden_answered", "golden_accuracy", "agreement")

    def figures(*values):
        return dict(zip(keys, values))

    # per experiment: its answers, golden accuracy and agreement (the share of other raters' answers to the same pairs
    # that are the same), all raters together and each rater's
    a, b, c = experiments["a"], experiments["b"], experiments["c"]
    assert {k: a[k] for k in keys} == figures(6, 2, 1.0, 0.667)
    assert a["raters"] == [{"rater": "ann", **figures(3, 1, 1.0, 0.667)}, {"rater": "bob", **figures(3, 1, 1.0, 0.667)}]
    assert {k: b[k] for k in keys} == figures(5, 3, 0.667, 0.25)  # 2 of 8 answers compared agree
    assert b["raters"] == [
        {"rater": "ann", **figures(2, 1, 0.0, 0.0)},
        {"rater": "bob", **figures(2, 1, 1.0, 0.333)},
        {"rater": "cid", **figures(1, 1, 1.0, 0.5)},
    ]
    assert ({k: c[k] for k in keys}, c["raters"]) == (figures(0, 0, None, None), [])
    # and the totals over every experiment, as before
    raters = {r["rater"]: r for r in summary["raters"]}
    assert raters["ann"] == {"rater": "ann", **figures(5, 2, 0.5, 0.333), "excluded": False}
    assert raters["bob"] == {"rater": "bob", **figures(5, 2, 1.0, 0.5), "excluded": False}
    assert raters["cid"] == {"rater": "cid", **figures(1, 1, 1.0, 0.5), "excluded": False}
    assert (summary["agreement"], summary["golden_accuracy"]) == (0.429, 0.8)  # 6 of 14; 4 of 5


def test_answers_labels_and_open_pairs_export_as_json_lines_csv_and_a_crowd_task_file(label_server):
    server = label_server(token="s3cret")
    post_pair(server, "p1", metadata={"left_true_return": 1.5})
    post_pair(server, "p2")
    post_pair(server, "q1", experiment="other")
    answer(server, "p1", "ann", "left")
    answer(server, "q1", "bob", "right")

    status, text = download(server, "/api/export?what=labels&experiment=exp")
    assert status == 200
    (label,) = [json.loads(line) for line in text.splitlines()]
    assert {k: label[k] for k in ("pair_id", "left_clip", "right_clip", "choice", "votes", "metadata")} == {
        "pair_id": "p1",
        "left_clip": "p1-l",
        "right_clip": "p1-r",
        "choice": "left",
        "votes": ["left"],
        "metadata": {"left_true_return": 1.5},
    }
    status, text = download(server, "/api/export?what=answers&format=csv")  # every experiment
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["experiment"], r["pair_id"], r["rater"], r["choice"]) for r in rows] == [
        ("exp", "p1", "ann", "left"),
        ("other", "q1", "bob", "right"),
    ]
    assert json.loads(rows[0]["metadata"]) == {"left_true_return": 1.5}
    status, text = download(server, "/api/export?what=pairs&format=tsv&experiment=exp")
    assert text.splitlines() == ["INPUT:video1\tINPUT:video2", f"{server.url}/clips/p2-l\t{server.url}/clips/p2-r"]
    status, text = download(server, "/api/export?what=pairs&format=tsv&base=https://labels.example.org/")
    assert text.splitlines()[1] == "https://labels.example.org/clips/p2-l\thttps://labels.example.org/clips/p2-r"
    for base in ["labels.example.org", "https://x.org/\tq1-l", "https://x.org/\nq1-l\tq1-r"]:  # a tab or line: a row
        status, text = download(server, "/api/export?what=pairs&format=tsv&base=" + urllib.parse.quote(base))
        assert status == 400 and "base" in json.loads(text)["error"], (base, status, text)

    assert download(server, "/api/export?what=labels", token="wrong")[0] == 401
    assert download(server, "/api/export?what=votes")[0] == 400
    status, text = download(server, "/api/export?what=labels&format=tsv")
    assert status == 400 and "what=pairs" in json.loads(text)["error"]


CROWD_HEADER = "INPUT:video1\tINPUT:video2\tOUTPUT:result\tASSIGNMENT:worker_id\n"


def import_tsv(server, text):
    return server.call("POST", "/api/import", raw=text.encode(), headers={"Content-Type": "text/tab-separated-values"})


def test_answers_from_a_crowd_platform_are_imported_and_voted_on_like_raters(label_server):
    server = label_server("--overlap", 3, token="s3cret")
    post_pair(server, "p1")
    post_pair(server, "p2")
    tasks = download(server, "/api/export?what=pairs&format=tsv")[1].splitlines()[1:]
    p1_left, p1_right = tasks[0].split("\t")
    # the platform's result file: three workers per pair; one was shown p1 the other way round, one clip did not load
    results = CROWD_HEADER + "".join(
        [
            f"{p1_left}\t{p1_right}\tleft\tw1\n",
            f"{p1_left}\t{p1_right}\tleft\tw2\n",
            f"{p1_right}\t{p1_left}\tleft\tw3\n",  # its left is p1's right
            "p2-l\tp2-r\terror\tw1\n",  # clip ids work as well as URLs
            "p2-l\tp2-r\tright\tw2\n",
            "p2-l\tp2-r\tRight\tw3\n",
        ]
    )
    counts = {"rows": 6, "without_worker_id": 0, "file": hashlib.sha256(results.encode()).hexdigest()[:12]}
    assert import_tsv(server, results) == (200, {**counts, "recorded": 6, "duplicates": 0})
    assert {x["pair_id"]: (x["choice"], x["votes"]) for x in labels(server)} == {
        "p1": ("left", ["left", "left", "right"]),
        "p2": ("right", ["cant_tell", "right", "right"]),
    }
    assert [a["rater"] for a in server.call("GET", "/api/pairs/p1")[1]["answers"]] == ["crowd-w1", "crowd-w2", "crowd-w3"]
    assert import_tsv(server, results) == (200, {**counts, "recorded": 0, "duplicates": 6})  # the same file again

    # one bad row rejects the whole file: nothing of it is recorded
    post_pair(server, "p3")
    bad = CROWD_HEADER + "p3-l\tp3-r\tleft\tw1\nnope-l\tnope-r\tleft\tw1\np3-l\tp3-r\tmaybe\tw2\n"
    status, reply = import_tsv(server, bad)
    assert status == 400 and "line 3" in reply["error"] and "line 4" in reply["error"], reply
    assert server.call("GET", "/api/pairs/p3")[1]["answers"] == []
    status, reply = import_tsv(server, CROWD_HEADER + "http://[x/clips/p3-l\tp3-r\tleft\tw1\n")  # no URL: a bad row
    assert status == 400 and "line 2" in reply["error"], reply
    status, reply = import_tsv(server, "video1\tvideo2\tresult\np3-l\tp3-r\tleft\n")
    assert status == 400 and "INPUT:video1" in reply["error"]
    status, reply = import_tsv(server, CROWD_HEADER)  # a header and no rows: nothing to record, said so
    assert (status, reply["rows"], reply["recorded"]) == (200, 0, 0), reply
    # files Python's csv module cannot read: lines ended by CR alone (old spreadsheets), a field over its size limit
    for unreadable in [bad.replace("\n", "\r"), CROWD_HEADER + "p3-l\tp3-r\tleft\t" + "w" * 200_000 + "\n"]:
        status, reply = import_tsv(server, unreadable)
        assert status == 400 and "the TSV cannot be read" in reply["error"], (status, reply)
    assert server.call("GET", "/api/pairs/p3")[1]["answers"] == []
    assert server.call("POST", "/api/import", raw=results.encode(), token="wrong")[0] == 401


def test_a_crowd_comment_that_opens_a_quote_rejects_the_file_rather_than_swallow_rows(label_server):
    """A free-text field starting with a double quote (a worker's comment) made Python's csv module read on, over tabs
    and line ends, to the next quote: the rows in between vanished and the first row's answer was stored under a later
    row's worker, with a 200. Such a file is rejected, naming the lines, and nothing is recorded."""
    server = label_server(token="s3cret")
    for pair_id in ("p1", "p2", "p3"):
        post_pair(server, pair_id)
    header = "INPUT:video1\tINPUT:video2\tOUTPUT:result\tOUTPUT:comment\tASSIGNMENT:worker_id\n"
    rows = 'p1-l\tp1-r\tleft\t"left one walks\tw1\np2-l\tp2-r\tright\tok\tw2\np3-l\tp3-r\tright\tsee "gait"\tw3\n'
    status, reply = import_tsv(server, header + rows)
    assert status == 400 and "lines 2-4" in reply["error"] and "quote" in reply["error"], (status, reply)
    assert [server.call("GET", f"/api/pairs/{p}")[1]["answers"] for p in ("p1", "p2", "p3")] == [[], [], []]
    # so does a runaway quote in a column the header does not name
    status, reply = import_tsv(server, header + 'p1-l\tp1-r\tleft\tok\tw1\t"x\np2-l\tp2-r\tright\tok\tw2"\n')
    assert status == 400 and "lines 2-3" in reply["error"], (status, reply)
    # a quoted field, on its line or over two (a comment of two lines), is read as before, and the rows after it and
    # after a blank line keep their lines' numbers
    text = header + 'p1-l\tp1-r\tleft\t"a\tb"\tw1\n\np2-l\tp2-r\tright\t"two\nlines"\tw2\nnope-l\tp2-r\tright\tok\tw2\n'
    status, reply = import_tsv(server, text)
    assert status == 400 and reply["error"].startswith("nothing imported: line 6:"), reply
    assert import_tsv(server, header + 'p2-l\tp2-r\tright\t"two\nlines"\tw2\n')[1]["recorded"] == 1
    assert import_tsv(server, header + 'p1-l\tp1-r\tleft\t"a\tb"\tw1\n')[1]["recorded"] == 1
    assert server.call("GET", "/api/pairs/p1")[1]["answers"] == [{"rater": "crowd-w1", "choice": "left"}]


def test_crowd_rows_without_a_worker_id_never_collide_with_another_files_rows(label_server):
    server = label_server("--overlap", 2, token="s3cret")
    post_pair(server, "p1")
    header = "INPUT:video1\tINPUT:video2\tOUTPUT:result\n"
    first, second = header + "p1-l\tp1-r\tleft\n", header + "p1-l\tp1-r\tright\n"  # the same line of two files
    assert import_tsv(server, first)[1]["recorded"] == 1
    status, reply = import_tsv(server, second)
    assert (status, reply["recorded"]) == (200, 1)
    file_id = hashlib.sha256(second.encode()).hexdigest()[:12]
    assert (reply["without_worker_id"], reply["file"]) == (1, file_id)
    assert (f"crowd-{file_id}-row2", "right") in answers_and_label(server, "p1")[0]
    assert sorted(labels(server)[0]["votes"]) == ["left", "right"]
    assert import_tsv(server, second)[1]["duplicates"] == 1  # the same file again records nothing


def test_an_answer_can_be_taken_back_for_undo_seconds_and_only_then_reaches_the_trainer(label_server):
    server = label_server("--undo-seconds", 2)
    post_pair(server, "p1")
    post_pair(server, "p2")
    assert next_pair(server, "ann")["pair_id"] == "p1"
    assert answer(server, "p1", "ann", "left")[1]["final"]
    assert next_pair(server, "ann")["pair_id"] == "p2"
    assert labels(server) == []  # not yet: ann may take it back
    assert take_back(server, "p1", "Ann") == (200, {"pair_id": "p1", "undone": True, "shown_again": True})
    assert answers_and_label(server, "p1") == ([], None)
    assert next_pair(server, "ann")["pair_id"] == "p1"  # the page shows it again
    assert answer(server, "p1", "ann", "right")[0] == 201
    time.sleep(2.2)
    assert [(x["pair_id"], x["choice"]) for x in labels(server)] == [("p1", "right")]
    status, reply = take_back(server, "p1", "ann")
    assert status == 409 and "too late" in reply["error"]
    status, reply = take_back(server, "p2", "ann")
    assert status == 404 and "no answer" in reply["error"]
    assert server.call("GET", "/api/stats?rater=ann")[1] == {"rater": "ann", "answered": 1, "waiting": 1, "counted": True}


def test_a_label_the_trainer_was_sent_cannot_be_taken_back_even_after_a_restart_with_a_longer_undo(label_server):
    """Only the label's age kept it from being taken back once sent: restarted with a longer --undo-seconds (or with
    the clock stepped back), the server let a rater take back a label the trainer had, and labelled the pair again
    under a new number, which the trainer never took (it no longer waited for the pair)."""
    server = label_server("--undo-seconds", 0.5)
    post_pair(server, "p1")
    assert answer(server, "p1", "ann", "left")[0] == 201
    time.sleep(0.7)
    assert [x["pair_id"] for x in labels(server)] == ["p1"]  # the trainer has it
    server.stop()
    server = label_server("--undo-seconds", 60, db=server.db)
    status, reply = take_back(server, "p1", "ann")
    assert status == 409 and "the trainer has been sent" in reply["error"], (status, reply)
    assert answers_and_label(server, "p1") == ([("ann", "left")], "left")
    post_pair(server, "p2")  # a label not yet sent is taken back as before
    assert answer(server, "p2", "ann", "left")[0] == 201
    assert take_back(server, "p2", "ann")[0] == 200


def test_taking_back_an_answer_that_did_not_make_the_label_leaves_the_label(label_server):
    """At overlap 1 a lease that expired gives one pair to two raters: the first answer makes the label, the second is
    only recorded. Taking the second back must not take the label (which the trainer may have) with it."""
    server = label_server("--lease-seconds", 0.5, "--undo-seconds", 1, token="s3cret")
    post_pair(server, "p1")
    assert next_pair(server, "ann")["pair_id"] == "p1"
    time.sleep(0.8)  # ann's lease expires
    assert next_pair(server, "bob")["pair_id"] == "p1"
    assert answer(server, "p1", "bob", "left")[1]["final"]  # bob's answer makes the label
    assert answer(server, "p1", "ann", "right")[0] == 201  # ann's, a moment later, is only recorded
    status, reply = take_back(server, "p1", "ann")
    assert answers_and_label(server, "p1") == ([("bob", "left")], "left")
    assert (status, reply["shown_again"]) == (200, False)  # the pair needs no answer: ann is given the next one
    time.sleep(1.2)
    (label,) = labels(server)  # the trainer gets bob's label
    assert (label["choice"], label["votes"]) == ("left", ["left"])
    assert server.call("POST", "/api/experiments/exp/close")[0] == 200  # and its run ends
    assert answer(server, "p1", "ann", "right")[0] == 201  # ann answers again, from a page left open
    assert take_back(server, "p1", "ann")[0] == 200
    assert answers_and_label(server, "p1") == ([("bob", "left")], "left")  # the label the trainer has stays
    assert labels(server, since=label["seq"]) == []
    assert next_pair(server, "cat") is None  # and the closed experiment's pair is not served again


def test_taking_back_the_answer_that_made_the_label_lets_the_answers_left_make_it(label_server):
    server = label_server("--lease-seconds", 0.5, "--undo-seconds", 60, token="s3cret")
    post_pair(server, "p1")
    post_pair(server, "p2")
    assert next_pair(server, "ann")["pair_id"] == "p1"
    time.sleep(0.8)
    assert next_pair(server, "bob")["pair_id"] == "p1"
    answer(server, "p1", "ann", "left")  # makes the label
    answer(server, "p1", "bob", "right")
    assert take_back(server, "p1", "ann")[0] == 200
    assert answers_and_label(server, "p1") == ([("bob", "right")], "right")
    assert next_pair(server, "cat")["pair_id"] == "p2"  # p1 has its label: nobody is asked again
    # an answer to a pair of a closed experiment is labelled; taken back, the pair stays closed
    assert server.call("POST", "/api/experiments/exp/close")[1]["closed"] == 1
    answer(server, "p2", "dan", "left")
    status, reply = take_back(server, "p2", "dan")
    assert answers_and_label(server, "p2") == ([], None)
    assert next_pair(server, "dan") is None and next_pair(server, "eve") is None
    assert (status, reply["shown_again"]) == (200, False)


def test_a_rater_is_told_when_their_answers_stop_counting(label_server):
    server = label_server("--golden-min", 2, "--golden-every", 1)
    for i in range(2):
        post_pair(server, f"g{i}", golden="left")
    post_pair(server, "p1")
    for i in range(2):
        assert answer(server, f"g{i}", "ann", "right")[0] == 201
    assert server.call("GET", "/api/stats?rater=ann")[1]["counted"] is False
    assert next_pair(server, "ann")["counted"] is False
    assert next_pair(server, "bob")["counted"] is True


def test_with_rater_keys_each_rater_answers_only_in_their_own_name(label_server, tmp_path):
    keys = tmp_path / "raters.txt"
    keys.write_text(
        "# name key\nAlice k-alice-0123\nbob k-bob-4567\ncarol k-carol-89  # a comment after the key\ndan k#d+/=&9\n"
    )
    server = label_server("--rater-keys", keys)
    post_pair(server, "p1")
    post_pair(server, "p2")
    status, reply = server.call("GET", "/api/pairs/next?rater=alice")
    assert status == 401 and "personal link" in reply["error"]
    assert server.call("GET", "/api/pairs/next?rater=alice", headers={"X-Rater-Key": "guess"})[0] == 401
    status, pair = server.call("GET", "/api/pairs/next?key=k-alice-0123")  # the link's key, as the page sends it
    assert (status, pair["rater"]) == (200, "alice")
    # bob's key answers as bob, whatever name the body gives
    bob = {"X-Rater-Key": "k-bob-4567"}
    status, _ = server.call("POST", "/api/labels", {"pair_id": "p1", "rater": "alice", "choice": "left"}, headers=bob)
    assert status == 201
    assert server.call("GET", "/api/pairs/p1")[1]["answers"] == [{"rater": "bob", "choice": "left"}]
    assert server.call("POST", "/api/labels", {"pair_id": "p2", "rater": "alice", "choice": "left"})[0] == 401
    assert server.call("GET", "/api/stats", headers=bob)[1] == {"rater": "bob", "answered": 1, "waiting": 1, "counted": True}
    assert "/?key=k-alice-0123" in server.log("?key=k-bob-4567")  # each rater's link is printed at the start
    assert server.call("GET", "/api/stats", headers={"X-Rater-Key": "k-carol-89"})[1]["rater"] == "carol"
    # a key with "#" (it cut the key there) and other characters a link must quote: the printed link carries it
    link = re.search(r"rater dan: (\S+)", server.log("rater dan"))[1]
    assert server.call("GET", "/api/stats?" + urllib.parse.urlsplit(link).query)[1]["rater"] == "dan"


@pytest.mark.parametrize(
    "text, message",
    [
        ("alice\n", "name and a key"),
        ("alice k1\nbob k1\n", "line 2: this key is also line 1's"),
        ("alice k1\nALICE k2\n", "line 2: 'ALICE' is the rater of line 1, 'alice'"),
        ("alice k1\n\uff21lice k2\n", "the rater of line 1"),  # full width: one rater
        ("x½ k1\n", "NFKC"),  # ½ is a digit, but 1⁄2 has a fraction slash
        ("<b> k1\n", "rater"),
        # a key a request header cannot carry (the page sends it as X-Rater-Key)
        ("alice k\x01y\n", "a key must be printable ASCII"),
        ("alice kéy\n", "a key must be printable ASCII"),
    ],
)
def test_a_malformed_rater_keys_file_stops_the_server_with_its_line(tmp_path, text, message):
    keys = tmp_path / "raters.txt"
    keys.write_text(text)
    result = subprocess.run(
        [sys.executable, ls.__file__, "--port", "0", "--db", str(tmp_path / "x.sqlite"), "--rater-keys", str(keys)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and message in result.stderr and "raters.txt" in result.stderr, result.stderr


def test_a_label_young_enough_to_be_taken_back_holds_back_the_labels_after_it(tmp_path):
    """The trainer asks for labels after the last sequence number it has: a label skipped because it is still within
    --undo-seconds must not be passed by a later one (whose clock time can be older if the system clock stepped back)."""
    store = ls.LabelStore(str(tmp_path / "labels.sqlite"), undo_seconds=10)
    store.put_clip("c", "video/webm", CLIP)
    now = time.time()
    for seq, created in [(1, now - 20), (2, now), (3, now - 30)]:  # label 3 made after a clock step back
        pair = {"experiment": "exp", "pair_id": f"p{seq}", "left_clip": "c", "right_clip": "c"}
        store.add_pair({**pair, "instruction": "Which?", "metadata": {}, "golden": None})
        store.db.execute(
            "INSERT INTO labels (seq, pair_id, experiment, choice, votes, created) VALUES (?, ?, 'exp', 'left', '[]', ?)",
            (seq, f"p{seq}", created),
        )
    assert [label["seq"] for label in store.labels_since("exp", 0)] == [1]


def test_behind_a_reverse_proxy_its_public_address_is_accepted(label_server):
    server = label_server("--public-url", "https://labels.example.org")
    post_pair(server, "p1")
    public = {"Origin": "https://labels.example.org"}
    vote = {"pair_id": "p1", "rater": "ann", "choice": "left"}
    # a proxy that passes the public Host on, and one that rewrites it to the server's own address
    assert server.call("POST", "/api/labels", vote, headers={**public, "Host": "labels.example.org"})[0] == 201
    assert server.call("POST", "/api/labels", {**vote, "rater": "bob"}, headers=public)[0] == 201
    assert server.call("GET", "/", headers={"Host": "labels.example.org"})[0] == 200
    assert server.call("POST", "/api/labels", {**vote, "rater": "cid"}, headers={"Origin": "https://evil.example"})[0] == 403
    assert server.call("GET", "/", headers={"Host": "evil.example"})[0] == 403
    # the crowd task file points at the public address, not at the proxy's way in (127.0.0.1 over http)
    post_pair(server, "p2")
    tasks = download(server, "/api/export?what=pairs&format=tsv")[1].splitlines()
    assert tasks[1:] == ["https://labels.example.org/clips/p2-l\thttps://labels.example.org/clips/p2-r"], tasks
