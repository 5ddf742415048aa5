// The node's console: the cluster, the lock table under a prefix, and a
// timeline of its grants, releases and expiries as this node applies them.
// Everything is read from the Lock API with this browser's credentials (a
// client certificate, or a bearer token kept in this tab), so the node's
// ACL decides what is shown: the table lists the keys the identity may
// read, the timeline those it may watch. Read-only.
"use strict";

const TOKEN = "fencegate-token";
// Timeline events kept (the latest), and how often the rest is read again.
const KEPT = 500;
const EVERY_MS = 2000;

let prefix = "";
let focus = null; // the key whose timeline is shown; null: every key
const events = []; // latest first
const holders = new Map(); // token -> holder, of the leases live since the page opened
let run = null; // the current search's AbortController

class Refused extends Error {}

// A Lock API answer as JSON; a refusal says why, and asks for a token on 401.
async function api(path, signal) {
  const resp = await fetch(path, { headers: bearer(TOKEN), cache: "no-store", signal });
  if (resp.ok) return resp;
  let why = resp.status + "";
  try {
    const body = await resp.json();
    why = body.error + (body.message ? ": " + body.message : "");
  } catch (_) {}
  if (resp.status === 401 || resp.status === 403) {
    $("#login").hidden = false;
    throw new Refused(why);
  }
  throw new Error(why);
}

const seconds = (ms) => (ms === null || ms === undefined ? null : (ms / 1000).toFixed(1) + " s");

function showCluster(c, ready) {
  $("#title").textContent = "fencegate node " + c.id;
  const facts = $("#cluster-facts");
  facts.replaceChildren();
  const add = (k, v) => {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v === null || v === undefined ? "none" : String(v);
    facts.append(dt, dd);
  };
  add("health", ready);
  add("this node", c.id + " (" + c.state + ")");
  add("leader", c.leader === null ? "NONE KNOWN" : c.leader);
  add("term", c.term);
  add("applied index", c.commit_index);
  add("last log index", c.last_log_index);
  add("snapshot index", c.snapshot_index);
  add("rules", c.rules);
  add("cluster id", c.cluster);
  add("members", c.members.map((m) => m.id + (m.id === c.leader ? " (leader)" : "") + (m.url ? " " + m.url : "")).join(", "));
  $("#cluster").hidden = false;
}

function showLocks(table) {
  const body = $("#locks tbody");
  body.replaceChildren();
  for (const l of table.locks) {
    const row = body.insertRow();
    row.className = l.held ? "held" : "free";
    const key = cell(row, "", "key");
    const pick = document.createElement("button");
    pick.type = "button";
    pick.className = "key";
    pick.textContent = l.key;
    pick.title = "Show this key's timeline";
    pick.addEventListener("click", () => setFocus(l.key));
    key.append(pick);
    const state = l.held ? "held" : l.delay_left_ms !== null ? "lock-delay, " + seconds(l.delay_left_ms) + " left" : "free";
    cell(row, state, "state", "state");
    cell(row, l.holder, "holder");
    cell(row, l.owner, "owner");
    cell(row, l.token, "token", "token");
    cell(row, seconds(l.expires_in_ms), "time left");
    cell(row, seconds(l.ttl_ms), "ttl");
    cell(row, seconds(l.lock_delay_ms), "lock-delay");
    cell(row, l.waiters, "waiters");
  }
  const n = table.locks.length;
  $("#locks-count").textContent =
    "(" + n + (n === 1 ? " key" : " keys") + " at revision " + table.rev +
    (table.truncated ? "; more under this prefix: narrow it" : "") + ")";
  $("#locks").hidden = false;
}

function eventRow(e, fresh) {
  const row = document.createElement("tr");
  row.className = e.event + (fresh ? " fresh" : "");
  cell(row, when(e.seen), "time");
  cell(row, e.key, "key");
  cell(row, e.event, "event", "event");
  cell(row, e.token, "token", "token");
  cell(row, e.holder, "holder");
  return row;
}

function showTimeline() {
  const shown = events.filter((e) => focus === null || e.key === focus);
  $("#timeline tbody").replaceChildren(...shown.map((e) => eventRow(e, false)));
  $("#timeline-of").textContent = focus === null ? "(every key, live, latest first)" : "(" + focus + ", live, latest first)";
  $("#all-keys").hidden = focus === null;
  $("#timeline").hidden = false;
}

function setFocus(key) {
  focus = key;
  showTimeline();
}

function asOf(rev) {
  $("#as-of").textContent = "Watching: complete up to revision " + rev + " (" + when(Date.now()) + ").";
}

// One line of the watch stream. State lines are the table's (read whole
// from /v1/locks); events go on the timeline and have the table read again.
function watchLine(text, refreshTable) {
  if (!text) return;
  const l = JSON.parse(text);
  if (l.event === "granted" || l.event === "released" || l.event === "expired") {
    if (l.event === "granted") holders.set(l.token, l.holder);
    const e = { seen: Date.now(), key: l.key, event: l.event, token: l.token, holder: holders.get(l.token) ?? null };
    if (l.event !== "granted") holders.delete(l.token);
    events.unshift(e);
    if (events.length > KEPT) events.pop();
    if (focus === null || focus === l.key) prepend($("#timeline tbody"), eventRow(e, true), KEPT);
    refreshTable();
    asOf(l.rev);
  } else if (l.event === "heartbeat") {
    asOf(l.rev);
  } else if (l.event === "resync") {
    status("Live (the node could not resume: the table was read again).", false);
  }
}

// `read` again, one at a time and at most once a second, however often
// asked (each watch event asks).
function throttled(read) {
  let reading = false;
  let again = false;
  const go = () => {
    if (reading) {
      again = true;
      return;
    }
    reading = true;
    read()
      .catch(() => {})
      .finally(() =>
        setTimeout(() => {
          reading = false;
          if (again) {
            again = false;
            go();
          }
        }, 1000),
      );
  };
  return go;
}

async function start() {
  if (run) run.abort();
  const mine = new AbortController();
  run = mine;
  const signal = mine.signal;
  const query = "prefix=" + encodeURIComponent(prefix);
  const readTable = async () => showLocks(await (await api("/v1/locks?" + query, signal)).json());
  const readCluster = async () => {
    const ready = await fetch("/readyz", { cache: "no-store", signal });
    const health = ready.ok ? "ready: a leader is known" : "NOT READY: " + (await ready.text()).trim();
    showCluster(await (await api("/v1/cluster", signal)).json(), health);
  };
  let timer = null;
  try {
    await Promise.all([readCluster(), readTable()]);
    $("#login").hidden = true;
    const refresh = throttled(() => Promise.all([readCluster(), readTable()]));
    timer = setInterval(refresh, EVERY_MS);
    let watch;
    try {
      watch = await api("/v1/watch?" + query, signal);
    } catch (e) {
      if (!(e instanceof Refused)) throw e;
      // It may read these keys but not watch them: the table, no timeline.
      status("Live, without a timeline (" + e.message + ").", false);
      await new Promise((_, fail) => signal.addEventListener("abort", () => fail(new Error("aborted"))));
    }
    showTimeline();
    status("Live.", false);
    await pieces(watch, "\n", (line) => watchLine(line, refresh));
  } catch (e) {
    if (signal.aborted) return;
    if (e instanceof Refused) {
      status("Refused: " + e.message, true);
      return;
    }
    status("Disconnected (" + e.message + "); retrying in 2 s.", true);
    setTimeout(() => run === mine && start(), 2000);
  } finally {
    clearInterval(timer);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  login("#login", "#token", TOKEN, start);
  $("#search").addEventListener("submit", (e) => {
    e.preventDefault();
    prefix = $("#prefix").value.trim();
    events.length = 0;
    focus = null;
    start();
  });
  $("#all-keys").addEventListener("click", () => setFocus(null));
  start();
});
