// The sidecar's console: its state once, then each refusal as it happens.
// Read-only; the admin token stays in this tab (common.js).
"use strict";

const TOKEN = "fencegate-admin-token";

function refusalRow(r, fresh) {
  const row = document.createElement("tr");
  row.className = fresh ? "refused fresh" : "refused";
  cell(row, new Date(r.at_ms).toISOString(), "time");
  cell(row, r.route, "route");
  cell(row, r.key, "key");
  cell(row, r.presented, "presented", "token");
  cell(row, r.current, "current", "token");
  cell(row, r.reason, "reason", "reason");
  return row;
}

function show(state, withRefusals) {
  $("#as-of").textContent = "As of " + new Date().toISOString() + " (refreshed every 5 s).";
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
    cell(row, f.key, "lock key");
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
  if (withRefusals) {
    $("#refusals tbody").replaceChildren(...state.refusals.map((r) => refusalRow(r, false)));
  }
  for (const section of ["#service", "#routes", "#floors", "#refusals"]) $(section).hidden = false;
}

// Server-Sent Events read with fetch, so that the token rides in a header.
// Opened before the state is fetched, so that no refusal falls between
// the two; one the state also lists is shown once.
function follow(resp) {
  return pieces(resp, "\n\n", (block) => {
    const event = /^event: (.*)$/m.exec(block);
    const data = /^data: (.*)$/m.exec(block);
    if (!event || !data) return;
    if (event[1] === "refusal") {
      const r = JSON.parse(data[1]);
      if (!seen.has(id(r))) {
        seen.add(id(r));
        $("#refusals tbody").prepend(refusalRow(r, true));
      }
    } else if (event[1] === "skipped") {
      status("Live (" + data[1] + " refusals skipped: the page fell behind).", false);
    }
  });
}

// The refusals shown, so that the feed and the state never show one twice.
const seen = new Set();
const id = (r) => [r.at_ms, r.route, r.key, r.presented, r.reason].join("\n");

// Everything but the refusals, again every few seconds: the lock
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
    state.refusals.forEach((r) => seen.add(id(r)));
    show(state, true);
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
