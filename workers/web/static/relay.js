// relay web: show times in the reader's clock, and follow a run's trace while it works.
"use strict";

function showTimes(root) {
  for (const cell of root.querySelectorAll("td.at[data-ms]")) {
    cell.textContent = new Date(Number(cell.dataset.ms)).toLocaleTimeString();
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
  cell(row, t.text).className = "text";
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
    const state = document.getElementById("run-state");
    state.textContent = answer.state + (answer.waiting_for ? ", waiting for " + answer.waiting_for : "");
    if (answer.state !== started) { location.reload(); return; }
    if (answer.state === "finished") return;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  showTimes(document);
  const facts = document.getElementById("run");
  if (facts && facts.dataset.state !== "finished") follow(facts);
});
