// ragpipe lab: progressive enhancement only (every page works without it).
// The comparison's "only cases that changed" box hides per-case rows where every metric tied.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("only-changed");
  const table = document.getElementById("per-case");
  if (!box || !table) return;
  const apply = () => {
    for (const row of table.querySelectorAll("tr[data-row]")) {
      const changed = row.querySelector('[data-outcome="win"], [data-outcome="loss"]') !== null;
      row.hidden = box.checked && !changed;
    }
  };
  box.addEventListener("change", apply);
  apply();
});
