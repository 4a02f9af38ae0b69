// relay web: show times (with their date) in the reader's clock, and follow a run's
// trace while it works.
"use strict";

function showTimes(root) {
  for (const cell of root.querySelectorAll(".at[data-ms]")) {
    cell.textContent = new Date(Number(cell.dataset.ms)).toLocaleString();
  }
}

function cell(row, text) {
  const td = row.insertCell();
  td.textContent = text;
  return td;
}

function traceRow(body, t) {
  const row = body.insertRow();
  row.className = t.kind;
  const at = cell(row, "");
  at.className = "at";
  at.dataset.ms = t.at_ms;
  cell(row, t.kind + (t.status ? " (" + t.status + ")" : ""));
  const call = cell(row, "");
  if (t.call_id) {
    const link = t.flower || t.run_link;
    const name = document.createElement(link ? "a" : "span");
    name.textContent = t.call_id;
    if (link) { name.href = link; name.title = t.flower ? "its Celery task in Flower" : "the specialist's run"; }
    call.append(name);
    if (t.tool) { const code = document.createElement("code"); code.textContent = " " + t.tool; call.append(code); }
  }
  if (t.made) {
    const made = document.createElement("span");
    made.className = "made hint";
    made.textContent = " " + t.made;
    call.append(made);
  }
  cell(row, t.text).className = "text";
}

// Whether the run is asking its model now: only then is a reply "being written".
let modelWriting = false;

// What the run's facts say that changes while it works: its tokens, cost and age.
function showNow(answer) {
  for (const [id, text] of [["run-tokens", answer.tokens_text], ["run-cost", answer.cost_text],
                            ["run-age", answer.age]]) {
    const shown = document.getElementById(id);
    if (shown && typeof text === "string") shown.textContent = text;
  }
}

async function follow(facts) {
  const body = document.querySelector("#trace tbody");
  let after = Number(facts.dataset.after);
  const started = facts.dataset.state;
  for (;;) {
    await new Promise((done) => setTimeout(done, 1500));
    let answer;
    try {
      answer = await (await fetch(`/api/runs/${encodeURIComponent(facts.dataset.run)}/trace?after=${after}`)).json();
    } catch (error) {
      continue;  // a dropped connection: try again at the next beat
    }
    for (const t of answer.entries || []) traceRow(body, t);
    showTimes(body);
    after = answer.next ?? after;
    modelWriting = answer.state === "running" && answer.waiting_for === "model";
    showNow(answer);
    const state = document.getElementById("run-state");
    state.textContent = answer.state + (answer.waiting_for ? ", waiting for " + answer.waiting_for : "");
    if (answer.state !== started) { location.reload(); return; }
    if (answer.state === "finished") return;
  }
}

// The final answer inside a reply being written (`{"final": "..."}`), decoded as far as
// it has come; null while the reply is something else (a tool call, a plan).
function finalSoFar(raw) {
  const start = /^\s*\{\s*"final"\s*:\s*"/.exec(raw);
  if (!start) return null;
  let text = "";
  for (let i = start[0].length; i < raw.length; i++) {
    const c = raw[i];
    if (c === '"') break;
    if (c !== "\\") { text += c; continue; }
    const e = raw[i + 1];
    if (e === undefined) break;  // an escape cut in two: wait for the rest
    if (e === "u") {
      const hex = raw.slice(i + 2, i + 6);
      if (hex.length < 4) break;
      text += String.fromCharCode(parseInt(hex, 16));
      i += 5;
      continue;
    }
    text += { n: "\n", t: "\t", r: "\r", b: "\b", f: "\f" }[e] ?? e;
    i += 1;
  }
  return text;
}

// Follow the run's replies as they are written (its live stream, polled).
async function followLive(facts) {
  const box = document.getElementById("live-box");
  const shown = document.getElementById("live");
  const who = document.getElementById("live-run");
  let after = "0";
  let raw = "";
  for (;;) {
    let answer;
    try {
      answer = await (await fetch(`/api/runs/${encodeURIComponent(facts.dataset.run)}/live?after=${after}`)).json();
    } catch (error) {
      answer = { events: [] };  // a dropped connection: try again at the next beat
    }
    for (const e of answer.events || []) {
      if (e.kind === "step" || e.kind === "restarted") { raw = ""; who.textContent = e.run_id; }
      else if (e.kind === "text") raw += e.text;
      else if (e.kind === "done" && e.run_id === facts.dataset.run) return;
    }
    after = answer.next ?? after;
    // Only a final answer's text is shown, never the reply's JSON: a reply that calls a
    // tool or gives a plan shows nothing, and so does one written before (the run parked,
    // runs its tools, or waits for its next reply to begin).
    const answerText = raw && modelWriting ? finalSoFar(raw) : null;
    if (answerText) {
      shown.textContent = answerText;
      box.hidden = false;
    } else {
      box.hidden = true;
    }
    await new Promise((done) => setTimeout(done, 700));
  }
}

// A call too long to show whole is folded: its Approve stays off until the person opens
// it, and the form then carries the digest of what was opened (the server checks it).
function foldedCalls(root) {
  for (const whole of root.querySelectorAll("details.whole-args")) {
    whole.addEventListener("toggle", () => {
      if (!whole.open) return;
      const place = whole.closest("tr, li");
      const form = place && place.querySelector("form.decide");
      if (!form) return;
      form.querySelector("input[name=seen]").value = whole.dataset.digest;
      const approve = form.querySelector("button.approve");
      approve.disabled = false;
      approve.removeAttribute("title");
    });
  }
}

// The approvals page shows itself anew now and then, unless the person is busy on it
// (typing a reason, editing arguments, reading a call opened whole).
function refreshWhenIdle(table) {
  const seconds = Number(table.dataset.refresh);
  let touched = false;
  document.addEventListener("input", () => { touched = true; });
  setInterval(() => {
    const busy = touched || document.querySelector("details[open]") ||
      (document.activeElement && document.activeElement.closest("form"));
    if (!busy) location.reload();
  }, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  foldedCalls(document);
  const refreshing = document.querySelector("[data-refresh]");
  if (refreshing) refreshWhenIdle(refreshing);
  const facts = document.getElementById("run");
  if (facts && facts.dataset.state !== "finished") {
    modelWriting = facts.dataset.state === "running" && facts.dataset.waiting === "model";
    follow(facts);
    followLive(facts);
  }
});
