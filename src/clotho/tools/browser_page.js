// The page as text for the browser toolset: visible text in reading order, each element one
// can act on numbered ([3] button "Send"). The numbered elements are kept in
// window.__clothoRefs for click/type/select; a new snapshot numbers them again.
(() => {
  const MAX_NODES = 20000;
  const refs = [];
  const out = [];
  let line = "";
  let seen = 0;
  const BLOCK = new Set([
    "ADDRESS", "ARTICLE", "ASIDE", "BLOCKQUOTE", "BR", "DD", "DIV", "DL", "DT", "FIELDSET",
    "FIGCAPTION", "FIGURE", "FOOTER", "FORM", "H1", "H2", "H3", "H4", "H5", "H6", "HEADER",
    "HR", "LI", "MAIN", "NAV", "OL", "P", "PRE", "SECTION", "TABLE", "TR", "UL", "LABEL",
  ]);
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "SVG", "IFRAME"]);
  const ROLES = new Set([
    "button", "link", "checkbox", "radio", "tab", "menuitem", "option", "switch", "textbox",
    "combobox", "searchbox",
  ]);
  const flush = () => {
    const text = line.replace(/\s+/g, " ").trim();
    if (text) out.push(text);
    line = "";
  };
  const clip = (s, n) => {
    s = (s || "").replace(/\s+/g, " ").trim();
    return s.length > n ? s.slice(0, n) + "..." : s;
  };
  const interactive = (el) => {
    const tag = el.tagName;
    if (tag === "A") return el.hasAttribute("href");
    if (tag === "INPUT") return el.type !== "hidden";
    if (tag === "BUTTON" || tag === "SELECT" || tag === "TEXTAREA" || tag === "SUMMARY") {
      return true;
    }
    const role = el.getAttribute("role");
    if (role && ROLES.has(role)) return true;
    return el.hasAttribute("onclick") || el.isContentEditable && el.getAttribute("contenteditable") !== null;
  };
  const describe = (el) => {
    const tag = el.tagName.toLowerCase();
    const role = el.getAttribute("role");
    const parts = [];
    let kind = role || tag;
    if (tag === "input") kind = "input type=" + (el.type || "text");
    if (tag === "a") kind = "link";
    parts.push(kind);
    let name = el.getAttribute("aria-label") || "";
    if (!name && el.labels && el.labels.length) name = el.labels[0].innerText;
    if (!name && tag !== "select" && tag !== "textarea" && tag !== "input") name = el.innerText;
    if (!name && tag === "input" && (el.type === "submit" || el.type === "button")) name = el.value;
    if (name) parts.push(JSON.stringify(clip(name, 80)));
    if (el.name) parts.push("name=" + JSON.stringify(el.name));
    if (el.placeholder) parts.push("placeholder=" + JSON.stringify(clip(el.placeholder, 60)));
    if (tag === "input" && (el.type === "checkbox" || el.type === "radio")) {
      parts.push(el.checked ? "checked" : "unchecked");
      if (el.value && el.value !== "on") parts.push("value=" + JSON.stringify(clip(el.value, 60)));
    } else if (tag === "select") {
      const chosen = el.selectedOptions.length ? el.selectedOptions[0].text : "";
      parts.push("selected=" + JSON.stringify(clip(chosen, 60)));
      parts.push("options=" + JSON.stringify(Array.from(el.options).slice(0, 50).map((o) => clip(o.text, 40))));
    } else if (tag === "input" || tag === "textarea") {
      if (el.type !== "submit" && el.type !== "button") {
        parts.push("value=" + JSON.stringify(clip(el.value, 200)));
      }
    }
    if (tag === "a") {
      const href = el.getAttribute("href") || "";
      parts.push("href=" + JSON.stringify(clip(href, 120)));
    }
    if (el.disabled) parts.push("disabled");
    return parts.join(" ");
  };
  const walk = (node) => {
    if (++seen > MAX_NODES) return;
    if (node.nodeType === Node.TEXT_NODE) {
      line += node.nodeValue;
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const el = node;
    if (SKIP.has(el.tagName)) return;
    const style = window.getComputedStyle(el);
    if (style.display === "none" || style.visibility === "hidden") return;
    const block = BLOCK.has(el.tagName) || style.display === "block" || style.display === "flex";
    if (block) flush();
    if (/^H[1-6]$/.test(el.tagName)) line += "#".repeat(Number(el.tagName[1])) + " ";
    if (el.tagName === "LI") line += "- ";
    if (interactive(el)) {
      refs.push(el);
      line += " [" + refs.length + "] " + describe(el) + " ";
      const tag = el.tagName;
      if (tag === "SELECT" || tag === "TEXTAREA" || tag === "INPUT" || tag === "BUTTON" || tag === "A") {
        if (block) flush();
        return;  // its text is in the description
      }
    }
    for (const child of el.childNodes) walk(child);
    if (block) flush();
    if (el.tagName === "TD" || el.tagName === "TH") line += " | ";
  };
  if (document.body) walk(document.body);
  flush();
  window.__clothoRefs = refs;
  let text = out.join("\n");
  if (seen > MAX_NODES) text += "\n[the page is longer; only its first " + MAX_NODES + " nodes are shown]";
  return JSON.stringify({ title: document.title, url: location.href, text: text, refs: refs.length });
})()
