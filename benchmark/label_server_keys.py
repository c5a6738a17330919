"""How many pairs the rater page of label_server.py answers from keys a rater did not mean as answers (issue 20): a key
held down for a second, a second press soon after the first, and Enter or Space after a click on a button.

Each case starts the server on a free port of 127.0.0.1 with a fresh database in a temporary folder and 6 pairs of
1.5 s WebM/VP9 clips (encoded as tests/test_label_browser.py encodes them), opens the page in headless Chromium (the
system's /usr/bin/chromium and chromedriver, as the browser tests), waits until the page takes answers (both clips
have played through, on a page with that rule; the first pair shown, on an older one), then:
  held key     ArrowLeft held for --hold seconds, with the keydown events an operating system sends for a held key: one,
               then after --repeat-delay seconds one every 1/--repeat-rate seconds marked as repeats (autoRepeat in
               Chrome's DevTools protocol: KeyboardEvent.repeat on the page)
  two presses  ArrowLeft pressed and released twice, --gap seconds apart
  click        a click on the "Right is better" button, then, once the next pair is shown (and takes answers), Enter
               and Space
and counts the answers the server recorded 2 s after the keys (GET /healthz). Prints one line per case.

    python benchmark/label_server_keys.py
    python benchmark/label_server_keys.py --server /tmp/label_server_page_before.py   # another version's page
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
from selenium import webdriver

PAIRS = 6
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARROW_LEFT = {"key": "ArrowLeft", "code": "ArrowLeft", "windowsVirtualKeyCode": 37, "nativeVirtualKeyCode": 37}
# on a page with the watching rule, ready() says whether it takes answers; an older page takes them once it shows a pair
READY_JS = "return typeof ready === 'function' ? ready() : pair !== null && !busy"
# counts the keydown events the page sees, and how many of them are repeats
COUNT_KEYS_JS = """
window.keysSeen = {keydown: 0, repeat: 0};
document.addEventListener("keydown", (event) => { keysSeen.keydown++; if (event.repeat) keysSeen.repeat++; });
"""


def webm_clip(path, shade, frames=45, side=96, fps=30):
    """A 1.5 s clip written as the trainer writes its clips: a white square crossing a background of `shade`."""
    video = np.full((frames, side, side, 3), shade, np.uint8)
    for t, frame in enumerate(video):
        frame[40:56, 2 * t : 2 * t + 16] = 255
    output = ["-deadline", "realtime", "-cpu-used", "8", "-b:v", "0", "-crf", "32"]
    imageio.mimwrite(path, video, fps=fps, codec="libvpx-vp9", macro_block_size=1, output_params=output)
    return path.read_bytes()


def call(url, method="GET", body=None, raw=None, content_type="application/json"):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


class Server:
    """A label server with PAIRS pairs waiting, in a fresh database."""

    def __init__(self, script, folder, clips):
        command = [sys.executable, script, "--port", "0", "--db", str(Path(folder) / "labels.sqlite"), "--quiet"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        first = self.process.stdout.readline()  # "label server on http://127.0.0.1:PORT/ (database ...)"
        if not first.startswith("label server on "):
            self.process.kill()
            raise SystemExit(f"the server did not start: {first}")
        self.url = first.split()[3].rstrip("/")
        for i in range(PAIRS):
            for side in ("l", "r"):
                call(f"{self.url}/api/clips/c{i}{side}", "PUT", raw=clips[side == "r"], content_type="video/webm")
            pair = {"experiment": "keys", "pair_id": f"p{i}", "left_clip": f"c{i}l", "right_clip": f"c{i}r"}
            call(f"{self.url}/api/pairs", "POST", pair)

    def answers(self):
        return call(f"{self.url}/healthz")["answers"]

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)
        self.process.stdout.close()


def wait_until(condition, what, seconds=60):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.05)
    raise SystemExit(f"gave up after {seconds} s waiting until {what}")


def open_page(driver, server):
    driver.get(f"{server.url}/?rater=keys")
    driver.execute_script(COUNT_KEYS_JS)
    wait_until(lambda: driver.execute_script(READY_JS), "the page takes answers")


def hold_arrow_left(driver, seconds, delay, rate):
    """The keydown events of a key held down `seconds`: the first at once, repeats after `delay`, `rate` per second."""
    started = time.monotonic()
    driver.execute_cdp_cmd("Input.dispatchKeyEvent", {"type": "rawKeyDown", "autoRepeat": False, **ARROW_LEFT})
    next_repeat = started + delay
    while next_repeat < started + seconds:
        time.sleep(max(0.0, next_repeat - time.monotonic()))
        driver.execute_cdp_cmd("Input.dispatchKeyEvent", {"type": "rawKeyDown", "autoRepeat": True, **ARROW_LEFT})
        next_repeat += 1 / rate
    time.sleep(max(0.0, started + seconds - time.monotonic()))
    driver.execute_cdp_cmd("Input.dispatchKeyEvent", {"type": "keyUp", **ARROW_LEFT})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default=str(Path(__file__).resolve().parents[1] / "label_server.py"))
    parser.add_argument("--hold", type=float, default=1.0, help="seconds the key is held down")
    parser.add_argument("--repeat-delay", type=float, default=0.5, help="seconds before a held key repeats")
    parser.add_argument("--repeat-rate", type=float, default=30.0, help="repeats per second of a held key")
    parser.add_argument("--gap", type=float, default=0.15, help="seconds between the two presses")
    args = parser.parse_args()

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    with tempfile.TemporaryDirectory() as folder:
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1200,900"):
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={folder}/profile")
        clips = [webm_clip(Path(folder) / f"clip{i}.webm", shade=60 + 100 * i) for i in range(2)]
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
        try:
            version = driver.capabilities["browserVersion"]
            print(f"page of {args.server}; Chromium {version}, headless; {PAIRS} pairs waiting")
            for case in ("held key", "two presses", "click"):
                server = Server(args.server, tempfile.mkdtemp(dir=folder), clips)
                try:
                    open_page(driver, server)
                    if case == "held key":
                        hold_arrow_left(driver, args.hold, args.repeat_delay, args.repeat_rate)
                    elif case == "two presses":
                        key = webdriver.Keys.ARROW_LEFT
                        webdriver.ActionChains(driver).send_keys(key).pause(args.gap).send_keys(key).perform()
                    else:
                        driver.find_element("css selector", 'button[data-choice="right"]').click()
                        wait_until(lambda: server.answers() == 1, "the click's answer is recorded")
                        wait_until(lambda: driver.execute_script(READY_JS), "the next pair takes answers")
                        keys = (webdriver.Keys.ENTER, webdriver.Keys.SPACE)
                        webdriver.ActionChains(driver).send_keys(keys[0]).send_keys(keys[1]).perform()
                    time.sleep(2)  # answers the page sent are recorded by now
                    answered, seen = server.answers(), driver.execute_script("return keysSeen")
                finally:
                    server.stop()
                if case == "held key":
                    held = f"{args.hold:g} s (repeats after {args.repeat_delay:g} s, {args.repeat_rate:g}/s)"
                    print(
                        f"ArrowLeft held {held}: {seen['keydown']} keydown events on the page, {seen['repeat']} of them "
                        f"repeats: {answered} of {PAIRS} pairs answered"
                    )
                elif case == "two presses":
                    print(f"ArrowLeft pressed twice, {1000 * args.gap:.0f} ms apart: {answered} of {PAIRS} pairs answered")
                else:
                    print(f"a click on a button, then Enter and Space on the next pair: {answered - 1} answered by the keys")
        finally:
            driver.quit()


if __name__ == "__main__":
    main()
