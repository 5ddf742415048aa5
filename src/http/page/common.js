// What both consoles share: finding elements, filling table cells (each
// labelled, for the narrow layout), the status line, the bearer token kept
// in this tab only (sessionStorage), and reading a streamed answer.
"use strict";

const $ = (sel) => document.querySelector(sel);

function cell(row, text, label, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "none" : String(text);
  td.dataset.label = label;
  if (cls) td.className = cls;
  return td;
}

function status(text, down) {
  const s = $("#status");
  s.textContent = text;
  s.className = down ? "down" : "";
}

// The bearer token the operator gave this tab, if any, under `name`.
function bearer(name) {
  const token = sessionStorage.getItem(name);
  return token ? { Authorization: "Bearer " + token } : {};
}

// Hand each `separator`-ended piece of a streamed answer to `each`, until
// the stream ends (an error: a console's streams do not end by themselves).
async function pieces(resp, separator, each) {
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the stream ended");
    buffer += value;
    let end;
    while ((end = buffer.indexOf(separator)) >= 0) {
      const piece = buffer.slice(0, end);
      buffer = buffer.slice(end + separator.length);
      each(piece);
    }
  }
}

// The login form `form` keeps its token under `name` and calls `start`.
function login(form, input, name, start) {
  $(form).addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(name, $(input).value.trim());
    $(input).value = "";
    start();
  });
}

// Put `row` first in `body`, keeping at most `most` rows there.
function prepend(body, row, most) {
  body.prepend(row);
  while (body.rows.length > most) body.deleteRow(-1);
}

const when = (ms) => new Date(ms).toISOString().replace("T", " ").replace("Z", "");
