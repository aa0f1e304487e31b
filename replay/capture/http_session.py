"""Capture an HTTP browsing session: a real headless Chromium loads locally generated pages.

    python replay/capture/http_session.py OUT.trace.jsonl.gz [--pages 6] [--seed 2012] [--model 2022|2012]

Pages (HTML plus resources) are generated with sizes and counts drawn from distributions
set after the HTTP Archive's reports (see PAGE_MODEL), served by torbed's HTTP/1.1 file server
in one namespace behind a 20/5 mbit token-bucket link; Chromium (Debian's ``chromium``, headless, fresh profile, QUIC and
background networking off) loads them one after another from the other namespace, with a
reading pause between pages; tcpdump captures the client's veth (headers only). The TCP
flows become the trace (all flows of the one site share a circuit, as Tor Browser keeps a
first party on one circuit).
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torbed.replay import convert  # noqa: E402
from torbed.replay.capture.netpair import CLIENT_ADDR, SERVER_ADDR, NetPair  # noqa: E402
from torbed.replay.cli import Tcpdump  # noqa: E402
from torbed.replay.trace import write  # noqa: E402

PORT = 8080
DOWN_RATE, UP_RATE = "20mbit", "5mbit"

# Page model. Medians follow the HTTP Archive's mobile crawl as summarised in the Web Almanac
# 2022 "Page Weight" chapter (https://almanac.httparchive.org/en/2022/page-weight): a median
# page of about 2 MB in about 70 requests, HTML document about 30 KB; the spread (sigma of a
# lognormal, 90th percentile about 3x the median) approximates the heavy right tail of the
# almanac's percentile charts. The byte and request shares per resource type (images the
# largest byte share, scripts the most requests after images) are rounded from the same
# chapter. These are approximations set by hand from the published figures, not fitted data.
PAGE_MODEL = {
    "bytes_median": 2_000_000, "bytes_sigma": 0.85,
    "requests_median": 70, "requests_sigma": 0.6, "requests_max": 200,
    "html_median": 30_000, "html_sigma": 0.8,
    # type: (share of requests, share of bytes)
    "types": {"img": (0.50, 0.50), "js": (0.30, 0.38), "css": (0.10, 0.05), "font": (0.05, 0.05),
              "other": (0.05, 0.02)},
    # Uniform pause between page loads: a reader's dwell time (tens of seconds are typical:
    # Liu, White & Dumais, "Understanding Web Browsing Behaviors through Weibull Analysis of
    # Dwell Time", SIGIR 2010); set by hand, not fitted.
    "reading_pause_s": (10.0, 40.0),
}


# A lighter, 2012-sized web (Torchestra's traces were captured in 2012): the HTTP Archive's
# desktop crawl of late 2012 reported pages of about 1 MB on average in about 80 requests;
# with the same spread, medians of 700 KB and 55 requests give means of about 1.0 MB and 66.
# The access link is slower too: 6 mbit/s down, roughly the average broadband speed of
# 2012's public reports. Both approximations set by hand from published summaries (issue 37
# item 2: "a light 2012-size HTTP trace as a sensitivity check"), not fitted data.
PAGE_MODEL_2012 = {**PAGE_MODEL, "bytes_median": 700_000, "requests_median": 55, "html_median": 25_000}
MODELS = {"2022": (PAGE_MODEL, DOWN_RATE), "2012": (PAGE_MODEL_2012, "6mbit")}


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def generate_pages(root: Path, pages: int, seed: int) -> list[dict]:
    """Write ``pages`` pages (page<i>.html and their resources) under ``root``."""
    rng = random.Random(seed)
    out = []
    for i in range(pages):
        total = _lognormal(rng, PAGE_MODEL["bytes_median"], PAGE_MODEL["bytes_sigma"])
        n = max(3, min(PAGE_MODEL["requests_max"],
                       round(_lognormal(rng, PAGE_MODEL["requests_median"], PAGE_MODEL["requests_sigma"]))))
        html_size = int(_lognormal(rng, PAGE_MODEL["html_median"], PAGE_MODEL["html_sigma"]))
        types = PAGE_MODEL["types"]
        counts = {t: max(1, round(n * share[0])) for t, share in types.items()}
        tags = []
        sizes = {}
        for t, (_, byte_share) in types.items():
            weights = [rng.lognormvariate(0.0, 1.0) for _ in range(counts[t])]
            budget = total * byte_share
            for j, w in enumerate(weights):
                size = max(200, int(budget * w / sum(weights)))
                name = f"p{i}-{t}{j}.{ {'img': 'png', 'js': 'js', 'css': 'css', 'font': 'woff2', 'other': 'json'}[t] }"
                sizes[name] = size
                if t == "js":
                    body = b"/*" + b"x" * (size - 4) + b"*/"
                    tags.append(f'<script src="{name}"></script>')
                elif t == "css":
                    body = b"/*" + b"x" * (size - 4) + b"*/"
                    tags.append(f'<link rel="stylesheet" href="{name}">')
                elif t in ("font", "other"):
                    body = rng.randbytes(size)
                    tags.append(f'<link rel="preload" href="{name}" as="fetch" crossorigin>')
                else:
                    body = rng.randbytes(size)
                    tags.append(f'<img src="{name}" width="10" height="10">')
                (root / name).write_bytes(body)
        head = "\n".join(t for t in tags if not t.startswith("<img"))
        imgs = "\n".join(t for t in tags if t.startswith("<img"))
        html = f"<!DOCTYPE html><html><head><title>page {i}</title>\n{head}\n</head><body>\n{imgs}\n<p>"
        html += "lorem ipsum " * max(0, (html_size - len(html)) // 12) + "</p></body></html>\n"
        (root / f"page{i}.html").write_text(html)
        out.append({"page": f"page{i}.html", "requests": 1 + len(sizes),
                    "bytes": len(html) + sum(sizes.values())})
    return out


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--dump-dom"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pages", type=int, default=6)
    ap.add_argument("--seed", type=int, default=2012)
    ap.add_argument("--model", choices=sorted(MODELS), default="2022",
                    help="page sizes and access link: 2022 (HTTP Archive 2022, 20 mbit/s) or 2012 "
                         "(lighter pages, 6 mbit/s)")
    args = ap.parse_args(argv)
    global PAGE_MODEL, DOWN_RATE
    PAGE_MODEL, DOWN_RATE = MODELS[args.model]
    chromium = shutil.which("chromium")
    if not chromium:
        print("chromium not found: hack/install-deps.sh --capture", file=sys.stderr)
        return 1
    rng = random.Random(args.seed + 1)
    with tempfile.TemporaryDirectory(prefix="tbcap-http-") as tmp, NetPair() as net:
        tmp = Path(tmp)
        site = tmp / "site"
        site.mkdir()
        pages = generate_pages(site, args.pages, args.seed)
        # A broadband-like access link (tbf; this kernel has no netem, so no added delay):
        # without it the page would arrive at veth speed, a burst no real download shows.
        for ns, dev, rate in ((net.srv, net.srv_if, DOWN_RATE), (net.cli, net.cli_if, UP_RATE)):
            subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                            "burst", "32kb", "latency", "200ms"], check=True)
        server = subprocess.Popen(net.prefix("srv") + [sys.executable, "-m", "torbed.fileserver", "--dir", str(site),
                                                        "--bind", SERVER_ADDR, "--port", str(PORT)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        pcap = tmp / "http.pcap"
        loads = []
        try:
            with Tcpdump(net.cli_if, pcap, net.cli):
                for k, page in enumerate(pages):
                    t0 = time.time()
                    p = subprocess.run(net.prefix("cli") + [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile",
                                                            f"http://{SERVER_ADDR}:{PORT}/{page['page']}"],
                                       capture_output=True, text=True, timeout=120)
                    loads.append({**page, "load_s": round(time.time() - t0, 3), "rc": p.returncode})
                    print(f"{page['page']}: {page['requests']} requests, {page['bytes']} bytes, "
                          f"chromium {time.time() - t0:.1f} s (exit {p.returncode})", file=sys.stderr)
                    if k < len(pages) - 1:
                        time.sleep(rng.uniform(*PAGE_MODEL["reading_pause_s"]))
        finally:
            server.terminate()
            server.wait(5)
        version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
        trace = convert.from_pcap(pcap, filter=f"host {CLIENT_ADDR} and server port {PORT}", circuit_by="server", meta={
            "source": f"HTTP browsing session: {version} (headless) loading {len(pages)} generated pages "
                      f"from a local HTTP/1.1 server, one page per browser start, reading pauses "
                      f"{PAGE_MODEL['reading_pause_s'][0]:g}-{PAGE_MODEL['reading_pause_s'][1]:g} s; "
                      f"access link {DOWN_RATE} down / {UP_RATE} up (tbf), no added delay",
            "tool": "tcpdump -s 128 on the client's veth (offloads off) + torbed.replay.convert.from_pcap",
            "licence": "CC0-1.0", "origin": "captured by the torbed project on its own test machine "
                                           "(replay/capture/http_session.py); no third-party traffic",
            "page_model": PAGE_MODEL, "pages": loads, "seed": args.seed})
    write(trace, args.out)
    print(f"wrote {args.out}: {len(trace.flows)} flows, {trace.duration:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
