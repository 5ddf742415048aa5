// The sidecar's console: its state once, then each event of its timeline
// as it happens (grants and ends as the sidecar learns them, the first
// write forwarded with each token, refusals). Read-only; the admin token
// stays in this tab (common.js).
"use strict";

const TOKEN = "fencegate-admin-token";
// Events kept in the page (the latest), as the sidecar keeps them.
const KEPT = 2000;

const events = []; // latest first
let focus = null; // the key whose timeline is drawn

// A lock key that opens its timeline when clicked.
function keyCell(row, key, label) {
  const td = cell(row, "", label);
  const pick = document.createElement("button");
  pick.type = "button";
  pick.className = "key";
  pick.textContent = key;
  pick.title = "Draw this key's timeline";
  pick.addEventListener("click", () => draw(key));
  td.append(pick);
}

function refusalRow(r, fresh) {
  const row = document.createElement("tr");
  row.className = fresh ? "refused fresh" : "refused";
  cell(row, when(r.at_ms), "time");
  cell(row, r.route, "route");
  keyCell(row, r.key, "key");
  cell(row, r.presented, "presented", "token");
  cell(row, r.current, "current", "token");
  cell(row, r.reason, "reason", "reason");
  return row;
}

// One event of a key's timeline, in the lane of who acted: the lock
// service, the sidecar, the upstream. Each says what happened in words.
const LANES = {
  granted: (e) => ["grants token " + e.token, "", ""],
  ended: (e) => ["the lease of token " + e.token + " is over" + (e.presumed ? " (presumed: no longer listed)" : ""), "", ""],
  live: (e) => ["the lease of token " + e.token + " is live after all (a read)", "", ""],
  new_history: (e) => ["ANOTHER HISTORY (a restore?): " + e.why, "drops what it knew, keeps its floors", ""],
  // The floor rose to it as it was cleared; a last check before sending
  // that refused it would show as a refusal right after.
  forwarded: (e) => ["", "first write with token " + e.token + " forwarded", ""],
  refused: (e) => [
    "",
    "write with token " + (e.presented ?? "none") + " REFUSED: " + e.reason + " (current " + e.current + ")",
    "never sees it",
  ],
};

function laneRow(e) {
  const row = document.createElement("tr");
  row.className = e.event;
  const lanes = LANES[e.event](e);
  cell(row, when(e.at_ms), "time");
  cell(row, lanes[0], "lock service");
  cell(row, lanes[1], "sidecar", "sidecar");
  cell(row, lanes[2], "upstream");
  return row;
}

// Whether `e` belongs on `key`'s timeline: its own, or of every key.
const on = (e, key) => e.key === key || e.key === "";

// The seed's sequence diagram for `key`, oldest first, from what the page has.
function draw(key) {
  focus = key;
  const mine = events.filter((e) => on(e, key)).reverse();
  $("#timeline tbody").replaceChildren(...mine.map(laneRow));
  $("#timeline-of").textContent = key;
  $("#timeline").hidden = false;
}

function show(state, withTimeline) {
  $("#as-of").textContent = "As of " + when(Date.now()) + " (refreshed every 5 s).";
  const facts = $("#service-facts");
  facts.replaceChildren();
  const s = state.lock_service;
  const add = (k, v) => {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    facts.append(dt, dd);
  };
  if (s) {
    add("kind", s.kind);
    add("endpoints", s.endpoints.join(", "));
    add("state", s.up ? "up" : "DOWN");
    add("knowledge proven", s.knowledge_age_ms === null ? "never" : s.knowledge_age_ms + " ms ago");
    add("max_staleness", s.max_staleness_ms + " ms");
  } else {
    add("kind", "none (observed routes only)");
  }
  const routes = $("#routes tbody");
  routes.replaceChildren();
  for (const r of state.routes) {
    const row = routes.insertRow();
    cell(row, r.name, "route");
    cell(row, r.path, "path");
    cell(row, r.lock_key, "lock key");
    cell(row, r.fence, "fence");
  }
  const floors = $("#floors tbody");
  floors.replaceChildren();
  for (const f of state.floors.first) {
    const row = floors.insertRow();
    keyCell(row, f.key, "lock key");
    cell(row, f.floor, "highest token forwarded", "token");
  }
  const shown = state.floors.first.length;
  $("#floors-count").textContent =
    "(" + state.floors.keys + (state.floors.keys === 1 ? " key" : " keys") +
    (shown < state.floors.keys ? ", the first " + shown + " shown" : "") + ")";
  const open = $("#open tbody");
  open.replaceChildren();
  for (const r of state.idempotency_open) {
    const row = open.insertRow();
    cell(row, r.lock_key, "lock key");
    cell(row, r.token, "token", "token");
    cell(row, r.key, "key");
    cell(row, r.state === "unknown" ? "outcome unknown: " + r.why : "pending (in flight)", "state");
    cell(row, r.resolve || "settles itself when its request ends", "how to settle", "token");
  }
  $("#open").hidden = state.idempotency_open.length === 0;
  if (withTimeline) {
    events.splice(0, events.length, ...state.timeline.filter((e) => e.event in LANES));
    const refusals = events.filter((e) => e.event === "refused");
    $("#refusals tbody").replaceChildren(...refusals.map((r) => refusalRow(r, false)));
  }
  for (const section of ["#service", "#routes", "#floors", "#refusals"]) $(section).hidden = false;
}

// One event from the feed: kept, listed if a refusal, drawn if of the key
// whose timeline is shown. Kinds of a newer sidecar are skipped.
function happened(e) {
  if (!(e.event in LANES) || seen.has(e.seq)) return;
  seen.add(e.seq);
  events.unshift(e);
  if (events.length > KEPT) seen.delete(events.pop().seq);
  if (e.event === "refused") prepend($("#refusals tbody"), refusalRow(e, true), KEPT);
  if (focus !== null && on(e, focus)) {
    const lanes = $("#timeline tbody");
    lanes.append(laneRow(e));
    while (lanes.rows.length > KEPT) lanes.deleteRow(0);
  }
}

// Server-Sent Events read with fetch, so that the token rides in a header.
// Opened before the state is fetched, so that no event falls between the
// two; one the state also lists is shown once.
function follow(resp) {
  return pieces(resp, "\n\n", (block) => {
    const event = /^event: (.*)$/m.exec(block);
    const data = /^data: (.*)$/m.exec(block);
    if (!event || !data) return;
    if (event[1] === "skipped") {
      status("Live (" + data[1] + " events skipped: the page fell behind).", false);
    } else {
      happened(JSON.parse(data[1]));
    }
  });
}

// The events shown (by `seq`), so that the feed and the state never show
// one twice.
const seen = new Set();

// Everything but the timeline, again every few seconds: the lock
// service's state and age, and the floors, change.
async function refresh() {
  const resp = await fetch("/console/state", { headers: bearer(TOKEN), cache: "no-store" });
  if (!resp.ok) throw new Error("state: " + resp.status);
  return resp.json();
}

let refreshing = null;

async function start() {
  clearInterval(refreshing);
  try {
    const feed = await fetch("/console/events", { headers: bearer(TOKEN), cache: "no-store" });
    if (feed.status === 401 || feed.status === 403) {
      status("Refused: " + (await feed.json()).error, true);
      return;
    }
    if (!feed.ok) throw new Error("events: " + feed.status);
    const state = await refresh();
    seen.clear();
    state.timeline.forEach((e) => seen.add(e.seq));
    show(state, true);
    if (focus !== null) draw(focus);
    $("#login").hidden = true;
    status("Live.", false);
    refreshing = setInterval(() => refresh().then((s) => show(s, false)).catch(() => {}), 5000);
    await follow(feed);
  } catch (e) {
    clearInterval(refreshing);
    status("Disconnected (" + e.message + "); retrying in 2 s.", true);
    setTimeout(start, 2000);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  login("#login", "#token", TOKEN, start);
  if (sessionStorage.getItem(TOKEN)) start();
});
