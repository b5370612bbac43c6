// The console's browser scenarios, run by e2e/tests/test_console_browser.py against real servers:
// `node console.mjs <scenario>`. Debian's Chromium through playwright-core (no browser download),
// a fresh profile per run. Prints "ok <scenario>" when every step passed; exits 1 naming the step.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const GW = env("FLEET_GATEWAY");
const API = env("FLEET_API");
const DEMO = env("FLEET_DEMO");
const ADMIN = env("FLEET_ADMIN");
const TENANT_KEY = env("FLEET_TENANT_KEY");
const FINANCE = env("FLEET_FINANCE");
const BUDGET_KEY = env("FLEET_BUDGET_KEY"); // globex's: only the budgets scenario uses it
const LIMITS_KEY = env("FLEET_LIMITS_KEY"); // initech's: only the limits scenario uses it
const ARTIFACTS = env("FLEET_ARTIFACTS");
const FLAGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

let step = "start";
function check(condition, what) {
  if (!condition) throw new Error(`check failed: ${what}`);
}
async function shot(page, name, mask = []) {
  await sleep(400); // antd's dialogs and tabs finish moving before the picture (and the mask)
  await page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true, mask, animations: "disabled" });
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function signIn(page, base, token) {
  step = `sign in at ${base}`;
  await page.goto(`${base}/`);
  await page.getByPlaceholder("fsc_… or fk_…").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("button", { name: "Sign out" }).waitFor();
}

async function nav(page, label) {
  step = `open ${label}`;
  await page.locator(".ant-menu").getByRole("link", { name: label }).click();
}

async function navLabels(page) {
  return (await page.locator(".ant-menu-item").allInnerTexts()).map((t) => t.trim());
}

/** A chat through the gateway with `key`: its status and error message, if any. */
async function chat(key, model = "m", extra = {}) {
  const answer = await fetch(`${GW}/v1/chat/completions`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 2, ...extra }),
  });
  const body = await answer.json().catch(() => ({}));
  return { status: answer.status, message: body?.error?.message ?? "" };
}

/** Chats with `key` until one answers `status` (the gateway's catalog follows within its poll). */
async function until(key, status, what) {
  const deadline = Date.now() + 15000;
  let last;
  while (Date.now() < deadline) {
    last = await chat(key, "m", { max_tokens: 50 });
    if (last.status === status) return last;
    await sleep(300);
  }
  throw new Error(`check failed: ${what} (last answer ${last?.status} ${last?.message})`);
}

/** The text of the `testid` cell once it matches `pattern`. */
async function cellMatching(page, testid, pattern) {
  const cell = page.getByTestId(testid).filter({ hasText: pattern });
  await cell.waitFor();
  return (await cell.innerText()).trim();
}

/** Force-close the month the refusal names, after confirming. */
async function forceClose(page) {
  await page.getByTestId("force").click();
  const confirm = page.locator(".ant-modal-confirm");
  await confirm.waitFor();
  await sleep(400); // a click during antd's opening zoom can be lost
  await confirm.getByRole("button", { name: "Force close" }).click();
}

/** The shown report's CSV, downloaded and its header checked: the file's name. */
async function downloadCsv(page) {
  const [download] = await Promise.all([page.waitForEvent("download"), page.getByTestId("csv").click()]);
  const csv = readFileSync(await download.path(), "utf8");
  check(csv.startsWith("period,line,tenant,project"), `the CSV header (${csv.slice(0, 40)})`);
  return download.suggestedFilename();
}

function monthsAgo(n) {
  const now = new Date();
  const d = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() - n, 1));
  return `${d.getUTCFullYear()}-${String(d.getUTCMonth() + 1).padStart(2, "0")}`;
}

const scenarios = {
  async pages(page) {
    step = "sign-in page";
    await page.goto(`${GW}/`);
    await page.getByRole("button", { name: "Sign in" }).waitFor();
    await shot(page, "sign-in");
    await signIn(page, GW, ADMIN);
    check((await navLabels(page)).length === 7, "an admin is offered all seven pages");

    await nav(page, "Playground");
    await page.getByText("Paste a tenant's API key").waitFor();
    await page.getByPlaceholder("a tenant's API key").fill(TENANT_KEY);
    await page.locator(".ant-select-selection-item", { hasText: "m" }).waitFor();
    await page.getByTestId("max-tokens").fill("24");
    await page.getByTestId("send").click();
    await page.getByText("done", { exact: true }).waitFor();
    await shot(page, "playground");

    await nav(page, "Fleet");
    await page.getByText("ready", { exact: true }).first().waitFor();
    await page.getByText("acme/research").first().waitFor(); // the seeded requests
    await shot(page, "fleet-idle");

    await nav(page, "Models");
    await page.getByRole("cell", { name: "hf://fleet/tiny-gguf", exact: true }).waitFor();
    await page.locator(".ant-tag", { hasText: "Ready" }).first().waitFor();
    await page.locator(".ant-table-row-expand-icon").first().click();
    await page.getByText("tiny-q8_0.gguf").waitFor();
    await shot(page, "models");

    await nav(page, "Cluster");
    await page.getByText("gpu-east").first().waitFor();
    await page.getByText("h100-a").waitFor();
    await page.getByText("qwen-7b").first().waitFor();
    await shot(page, "cluster");

    await nav(page, "Tenants & keys");
    await page.getByRole("cell", { name: "Acme", exact: true }).waitFor();
    await page.getByRole("tab", { name: "Budget rules" }).click();
    await page.locator(".ant-progress").first().waitFor();
    await page.getByText(/^\d[\d,]* \/ 100,000$/).waitFor(); // used of the limit
    await shot(page, "tenants");

    await nav(page, "Usage");
    await page.locator(".recharts-surface").first().waitFor();
    await page.getByRole("cell", { name: "m", exact: true }).first().waitFor(); // agreement row
    await shot(page, "usage");

    await nav(page, "Costs");
    await page.getByText("2.50 USD").waitFor();
    await shot(page, "costs");

    step = "deep link reload";
    await page.reload();
    await page.getByText("Close a month").waitFor();
    check(page.url() === `${GW}/costs`, "the deep link stays");
    check((await page.locator(".ant-menu-item-selected").innerText()).trim() === "Costs", "Costs selected");
    step = "deep link in a new tab: the credential stays in its tab, the link survives sign-in";
    const other = await page.context().newPage();
    await other.goto(`${GW}/cluster`);
    await other.getByPlaceholder("fsc_… or fk_…").fill(ADMIN);
    await other.getByRole("button", { name: "Sign in" }).click();
    await other.getByText("h100-a").waitFor();
    check(other.url() === `${GW}/cluster`, "still /cluster");
    await other.close();
  },

  async playground(page) {
    await signIn(page, GW, TENANT_KEY);
    await nav(page, "Playground");
    await page.locator(".ant-select-selection-item", { hasText: "m" }).waitFor();
    step = "stream a long reply";
    await page.getByTestId("prompt").fill("Tell me everything.");
    await page.getByTestId("send").click();
    const reply = page.getByTestId("reply");
    await page.waitForFunction(() => document.querySelector('[data-testid="reply"]')?.textContent.length > 60);
    const early = (await reply.innerText()).length;
    await sleep(300);
    check((await reply.innerText()).length > early, "the reply grows token by token");
    step = "stop";
    await page.getByTestId("stop").click();
    await page.getByText("stopped", { exact: true }).waitFor();
    const stopped = (await reply.innerText()).length;
    await sleep(1000);
    check((await reply.innerText()).length === stopped, "nothing arrives after stop");
    check(stopped < 600 * 6, "the reply was cut short");
    await shot(page, "playground-stopped");

    step = "a complete reply with usage and the gateway's count";
    await page.getByRole("button", { name: "Clear" }).click();
    await page.getByTestId("max-tokens").fill("8");
    await page.getByTestId("prompt").fill("Just a few words.");
    await page.getByTestId("send").click();
    await page.getByText("done", { exact: true }).waitFor();
    const run = page.getByTestId("run");
    await run.getByText(/^\d+ \/ 8$/).first().waitFor(); // the engine's usage
    await page.waitForFunction(
      () => [...document.querySelectorAll('[data-testid="run"] .ant-statistic-content-value')].filter((e) => /^\d+ \/ \d+$/.test(e.textContent)).length >= 2,
    ); // and the gateway's own count beside it
    check(!(await run.getByText("–").count()), "TTFT and total time are shown");
    await shot(page, "playground-done");
  },

  async demo(page) {
    step = "open the demo gateway (no sign-in)";
    await page.goto(`${DEMO}/playground`);
    await page.getByText("no control plane").waitFor();
    check((await navLabels(page)).join(",") === "Playground,Fleet", "demo pages");
    await page.locator(".ant-select-selection-item", { hasText: "demo" }).waitFor();
    await page.getByTestId("max-tokens").fill("12");
    await page.getByTestId("prompt").fill("hello");
    await page.getByTestId("send").click();
    await page.getByText("done", { exact: true }).waitFor();
    check((await page.getByTestId("reply").innerText()).length > 0, "a reply");
    await shot(page, "demo-playground");
    await nav(page, "Fleet");
    await page.getByText("ready", { exact: true }).first().waitFor();
  },

  async models(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Models");
    step = "register hf://fleet/slow";
    await page.getByTestId("model-uri").fill("hf://fleet/slow");
    await page.getByPlaceholder("id (optional)").fill("slow");
    await page.getByTestId("register").click();
    await page.getByTestId("pull-slow").click();
    step = "progress moves";
    const bar = page.getByTestId("progress-slow");
    await bar.waitFor();
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="progress-slow"]')?.dataset.bytes) > 0);
    const first = Number(await bar.getAttribute("data-bytes"));
    await sleep(1500);
    const later = Number(await bar.getAttribute("data-bytes"));
    check(later > first, `progress moves (${first} then ${later})`);
    await shot(page, "models-pulling");
    step = "cancel";
    await page.getByTestId("cancel-slow").click();
    await page.locator(".ant-popconfirm").getByRole("button", { name: "OK" }).click();
    await page.getByTestId("status-slow").filter({ hasText: "Cancelled" }).waitFor();
    const status = await (await fetch(`${GW}/api/v1/models/slow`, { headers: { Authorization: `Bearer ${ADMIN}` } })).json();
    check(status.status === "Cancelled", `the registry says ${status.status}`);
  },

  async keys(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Tenants & keys");
    await page.getByRole("tab", { name: "API keys" }).click();
    step = "create a key";
    await page.getByTestId("key-project").click();
    await page.locator(".ant-select-item-option", { hasText: "acme/research" }).click();
    await page.getByTestId("key-label").fill("browser");
    await page.getByTestId("create-key").click();
    const secret = (await page.getByTestId("secret").innerText()).trim();
    check(secret.length > 20, "the secret is shown");
    await shot(page, "key-created", [page.getByTestId("secret").locator("code")]); // no secret in docs
    const works = await fetch(`${GW}/v1/models`, { headers: { Authorization: `Bearer ${secret}` } });
    check(works.status === 200, `the new key works (${works.status})`);
    step = "shown once";
    await page.getByRole("button", { name: "I have copied it" }).click();
    await page.getByTestId("secret").waitFor({ state: "hidden" });
    await page.getByRole("cell", { name: "browser", exact: true }).waitFor();
    const html = await page.content();
    const at = html.indexOf(secret);
    check(at < 0, `the secret is gone from the page (${html.slice(Math.max(0, at - 300), at + 80)})`);
    await page.reload();
    await page.getByRole("tab", { name: "API keys" }).click();
    await page.getByRole("cell", { name: "browser", exact: true }).waitFor();
    check(!(await page.content()).includes(secret), "and not shown again");
    step = "revoke asks first";
    await page.getByTestId("revoke-browser").click();
    await page.locator(".ant-popconfirm").getByRole("button", { name: "Revoke" }).click();
    await page.locator("tr", { hasText: "browser" }).getByText("revoked").waitFor();
    await sleep(1500); // the gateway's catalog follows within its poll interval
    const refused = await fetch(`${GW}/v1/models`, { headers: { Authorization: `Bearer ${secret}` } });
    check(refused.status === 401, `a revoked key is refused (${refused.status})`);
  },

  async costs(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Costs");
    step = "close: refused below the coverage minimum";
    await page.getByTestId("close").click();
    const refusal = page.getByTestId("refusal");
    await refusal.waitFor();
    check((await refusal.innerText()).toLowerCase().includes("coverage"), "the reason names coverage");
    await shot(page, "costs-refused");
    step = "force, after confirming";
    await forceClose(page);
    const report = page.getByTestId("report");
    await report.waitFor();
    await report.getByText("forced").waitFor();
    await page.getByTestId("periods").getByText("forced").waitFor();
    await shot(page, "costs-report");
    step = "CSV download";
    check(/^fleet-costs-\d{4}-\d{2}\.csv$/.test(await downloadCsv(page)), "its name");
  },

  async tenant(page) {
    await signIn(page, GW, TENANT_KEY);
    step = "pages offered";
    check((await navLabels(page)).join(",") === "Playground,Tenants & keys,Usage", "a tenant's pages");
    await page.goto(`${GW}/costs`); // not offered: falls back to the playground
    await page.getByTestId("prompt").waitFor();
    await nav(page, "Tenants & keys");
    await page.getByRole("cell", { name: "Acme", exact: true }).waitFor();
    check(!(await page.getByTestId("create-tenant").count()), "no write forms for a tenant");
    step = "its own tenant only";
    const tenants = await page.getByTestId("tenants").locator("tr.ant-table-row").allInnerTexts();
    check(tenants.length === 1 && tenants[0].includes("acme"), `only acme (${tenants})`);
    check(!(await page.getByText(/globex|initech/i).count()), "no other tenant named anywhere");
    check(!(await page.getByTestId("limits-acme").count()), "no limit editing for a tenant");
    await page.getByRole("tab", { name: "Budget rules" }).click();
    await page.getByText(/^\d[\d,]* \/ 100,000$/).waitFor();
    check(!(await page.getByTestId("create-rule").count()), "no rule creation for a tenant");
    check(!(await page.getByText(/globex|initech/i).count()), "no other tenant's rules");
    await page.getByRole("tab", { name: "API keys" }).click();
    const keyRows = await page.getByTestId("keys").locator("tr.ant-table-row").allInnerTexts();
    check(keyRows.length > 0 && keyRows.every((k) => k.includes("acme/")), `only acme's keys (${keyRows})`);
    const other = await page.evaluate((key) => fetch("/api/v1/tenants/globex", { headers: { Authorization: `Bearer ${key}` } }).then((r) => r.status), TENANT_KEY);
    check(other === 403, `another tenant is 403 (${other})`);
    await nav(page, "Usage");
    await page.locator(".recharts-surface").first().waitFor();
    await shot(page, "tenant-usage");
  },

  async slots(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Fleet");
    step = "idle: slots as each engine tells them";
    await cellMatching(page, "slots-lcpp", /^0 \/ 4$/); // llama-server's /props total_slots
    await cellMatching(page, "slots-m", /^0 \/ unknown$/); // vLLM does not publish its limit
    await cellMatching(page, "inflight-m", /^0 \/ 8$/); // the upstream's slots in fleet.yaml
    await cellMatching(page, "kv-m", /^\d+\.\d% of 65,536 tokens$/);
    await cellMatching(page, "kv-lcpp", /^unknown$/); // llama-server publishes no occupancy
    await cellMatching(page, "queue-lcpp", /^0$/);
    step = "a long stream takes a slot";
    const stop = new AbortController();
    const stream = fetch(`${GW}/v1/chat/completions`, {
      method: "POST",
      headers: { Authorization: `Bearer ${TENANT_KEY}`, "Content-Type": "application/json" },
      body: JSON.stringify({ model: "lcpp", stream: true, messages: [{ role: "user", content: "go on" }] }),
      signal: stop.signal,
    }).then((r) => r.body?.getReader().read(), () => undefined);
    try {
      await cellMatching(page, "slots-lcpp", /^1 \/ 4$/);
      await cellMatching(page, "inflight-lcpp", /^1$/);
      await shot(page, "fleet");
    } finally {
      stop.abort();
      await stream.catch(() => undefined);
    }
    step = "the slot is freed when the client goes";
    await cellMatching(page, "slots-lcpp", /^0 \/ 4$/);
    step = "a burst of requests shows as a rate (the counters' difference between two polls)";
    let bursting = true;
    const answered = [];
    const burst = (async () => {
      while (bursting) answered.push((await chat(TENANT_KEY, "m")).status);
    })();
    try {
      const rate = await cellMatching(page, "rps-m", /^(?!0\.00$)\d+\.\d\d$/);
      check(Number(rate) > 0, `the pool's req/s is above 0 (${rate})`);
      await cellMatching(page, "eps-m", /^0\.00$/); // none of them failed on the engine
      await shot(page, "fleet-burst");
    } finally {
      bursting = false;
      await burst;
    }
    check(answered.length > 0 && answered.every((s) => s === 200), `the burst was served (${answered.slice(-3)})`);
  },

  async budgets(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Tenants & keys");
    await page.getByRole("tab", { name: "Budget rules" }).click();
    step = "globex spends ~150 tokens";
    for (let n = 0; n < 3; n++) check((await chat(BUDGET_KEY, "m", { max_tokens: 45 })).status === 200, "globex is admitted");
    step = "create a rule on globex";
    await page.getByTestId("rule-scope").click();
    await page.keyboard.type("GLOB"); // searched on the server (q), not among the page's rows
    // The options are replaced when the search answers; a click on the old list as it goes is
    // lost (the form then says "pick a scope"), so wait for the answer, then for the choice.
    await page.locator(".ant-select-item-option", { hasText: "acme" }).waitFor({ state: "detached" });
    await page.locator(".ant-select-item-option", { hasText: "globex" }).click();
    await page.locator(".ant-select-selection-item", { hasText: "globex" }).waitFor();
    await page.getByTestId("rule-limit").fill("1000000");
    await page.getByTestId("rule-window").fill("2d");
    await page.getByTestId("create-rule").click();
    const row = page.getByTestId("rules").locator("tr", { hasText: "tenant globex" });
    await row.getByText(/^\d[\d,]* \/ 1,000,000$/).waitFor();
    check(!(await row.locator(".ant-progress-status-exception").count()), "well within the limit");
    check((await chat(BUDGET_KEY)).status === 200, "globex is admitted under a large budget");
    step = "a bad window is shown on its field, and nothing changes";
    await row.getByRole("button", { name: "Edit" }).click();
    const dialog = page.locator(".ant-modal", { hasText: "Budget rule on tenant globex" });
    await dialog.getByTestId("edit-rule-window").fill("1y");
    await dialog.getByRole("button", { name: "Save" }).click();
    const explain = dialog.locator(".ant-form-item-explain-error");
    await explain.waitFor();
    check((await explain.innerText()).toLowerCase().includes("window") || (await explain.innerText()).includes("match"), `the API's error on the window field (${await explain.innerText()})`);
    await shot(page, "budget-rule-error");
    step = "a limit below what globex spent, and a shorter window";
    await dialog.getByTestId("edit-rule-window").fill("1d");
    await dialog.getByTestId("edit-rule-limit").fill("100"); // a request fits, but not on top
    await dialog.getByRole("button", { name: "Save" }).click();
    await dialog.waitFor({ state: "hidden" });
    const used = row.getByText(/^\d[\d,]* \/ 100$/);
    await used.waitFor();
    await row.getByRole("cell", { name: "1d", exact: true }).waitFor();
    const spent = Number((await used.innerText()).split(" / ")[0].replaceAll(",", ""));
    check(spent > 100, `globex's ~150 tokens count in the new window (${spent})`);
    await row.locator(".ant-progress-status-exception").waitFor(); // shown as over its limit
    await shot(page, "budget-rule-edited");
    step = "the gateway enforces the new limit";
    const refused = await until(BUDGET_KEY, 429, "globex is refused by the edited rule");
    check(refused.message.includes("Budget exceeded"), `a budget refusal (${refused.message})`);
    step = "delete asks first, then the rule stops applying";
    await row.getByRole("button", { name: "Delete" }).click();
    await page.locator(".ant-popconfirm").getByRole("button", { name: "Delete" }).click();
    await row.waitFor({ state: "detached" });
    await until(BUDGET_KEY, 200, "globex is admitted once the rule is gone");
  },

  async limits(page) {
    await signIn(page, GW, ADMIN);
    await nav(page, "Tenants & keys");
    check((await chat(LIMITS_KEY)).status === 200, "initech answers before any limit");
    step = "a bad limit is shown on its field";
    await page.getByTestId("limits-initech").click();
    const dialog = page.locator(".ant-modal", { hasText: "Rate limits of initech" });
    await dialog.getByTestId("edit-token-limit").fill("0");
    await dialog.getByRole("button", { name: "Save" }).click();
    const explain = dialog.locator(".ant-form-item-explain-error");
    await explain.waitFor();
    check((await explain.innerText()).includes(">= 1"), `the API's error on tokenLimit (${await explain.innerText()})`);
    await shot(page, "limits-error");
    step = "one request per minute";
    await dialog.getByTestId("edit-token-limit").fill("");
    await dialog.getByTestId("edit-request-limit").fill("1");
    await dialog.getByRole("button", { name: "Save" }).click();
    await dialog.waitFor({ state: "hidden" });
    const row = page.getByTestId("tenants").locator("tr", { hasText: "initech" });
    await row.getByRole("cell", { name: "1", exact: true }).waitFor();
    await shot(page, "limits-edited");
    step = "the gateway applies it";
    const refused = await until(LIMITS_KEY, 429, "initech's second request in the minute is refused");
    check(refused.message.includes("Rate limit reached"), `a rate-limit refusal (${refused.message})`);
    step = "a project cannot be promised more than its tenant";
    await page.getByRole("tab", { name: "Projects" }).click();
    await page.getByTestId("limits-initech/reports").click();
    const project = page.locator(".ant-modal", { hasText: "Rate limits of initech/reports" });
    await project.getByTestId("edit-request-limit").fill("5");
    await project.getByRole("button", { name: "Save" }).click();
    const above = project.locator(".ant-form-item-explain-error, [data-testid=form-problem]");
    await above.first().waitFor();
    check((await above.first().innerText()).length > 10, `the API's reason is shown (${await above.first().innerText()})`);
    await project.getByTestId("edit-request-limit").fill("1");
    await project.getByRole("button", { name: "Save" }).click();
    await project.waitFor({ state: "hidden" });
    await page.locator("tr", { hasText: "initech/reports" }).getByRole("cell", { name: "1", exact: true }).waitFor();
  },

  async finance(page) {
    await signIn(page, GW, FINANCE);
    step = "pages offered to finance (ADR 0009)";
    const labels = (await navLabels(page)).join(",");
    check(labels === "Playground,Cluster,Tenants & keys,Usage,Costs", `finance's pages (${labels})`);
    for (const path of ["/fleet", "/models"]) {
      await page.goto(`${GW}${path}`); // not offered: falls back to the first page it may use
      await page.getByRole("button", { name: "Sign out" }).waitFor();
      const selected = (await page.locator(".ant-menu-item-selected").innerText()).trim();
      check(selected === "Playground", `${path} is not shown to finance (${selected})`);
    }
    step = "tenants read-only";
    await nav(page, "Tenants & keys");
    await page.getByRole("cell", { name: "Acme", exact: true }).waitFor();
    for (const id of ["create-tenant", "limits-acme", "create-key", "create-rule"]) {
      check(!(await page.getByTestId(id).count()), `no ${id} for finance`);
    }
    await page.getByRole("tab", { name: "Budget rules" }).click();
    await page.locator(".ant-progress").first().waitFor();
    check(!(await page.getByRole("button", { name: "Edit" }).count()), "no rule editing for finance");
    await page.getByRole("tab", { name: "API keys" }).click();
    check(!(await page.getByRole("button", { name: "Revoke" }).count()), "no revoking for finance");
    await nav(page, "Usage");
    await page.locator(".recharts-surface").first().waitFor();
    await nav(page, "Costs");
    step = "finance closes a month";
    await page.getByTestId("month").fill(monthsAgo(2)); // the costs scenario closes last month
    await page.getByTestId("close").click();
    await page.getByTestId("refusal").waitFor();
    await forceClose(page);
    step = "finance's report";
    await page.getByTestId("report").getByText("forced").waitFor();
    await shot(page, "finance-costs");
    step = "and downloads its CSV";
    const name = await downloadCsv(page);
    check(name === `fleet-costs-${monthsAgo(2)}.csv`, `its name (${name})`);
  },

  async cors(page) {
    step = "a page on a foreign origin";
    const server = createServer((_, res) => res.end("<!doctype html><title>elsewhere</title>"));
    await new Promise((resolve) => server.listen(0, "127.0.0.2", resolve));
    try {
      const foreign = `http://127.0.0.2:${server.address().port}/`;
      await page.goto(foreign);
      const call = ({ api, token }) =>
        fetch(`${api}/api/v1/whoami`, { headers: { Authorization: `Bearer ${token}` } }).then(
          (r) => `status ${r.status}`,
          (e) => `refused: ${e.name}`,
        );
      const refused = await page.evaluate(call, { api: API, token: ADMIN });
      check(refused === "refused: TypeError", `the control plane refuses ${foreign} (${refused})`);
      step = "the console's origin";
      await page.goto(`${GW}/healthz`); // the gateway's origin without the shell's CSP (connect-src 'self')
      const allowed = await page.evaluate(call, { api: API, token: ADMIN });
      check(allowed === "status 200", `the control plane allows the gateway's origin (${allowed})`);
    } finally {
      server.close();
    }
  },
};

const name = process.argv[2];
if (!scenarios[name]) {
  console.error(`no scenario ${name}: one of ${Object.keys(scenarios).join(", ")}`);
  process.exit(2);
}
const profile = mkdtempSync(join(tmpdir(), "fleet-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: env("FLEET_CHROMIUM"),
  headless: true,
  args: FLAGS,
  acceptDownloads: true,
  viewport: { width: 1400, height: 900 },
});
context.setDefaultTimeout(20000);
const page = context.pages()[0] ?? (await context.newPage());
const problems = [];
page.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
page.on("response", (r) => {
  if (r.url().includes("/assets/") && r.status() !== 200) problems.push(`asset ${r.url()} ${r.status()}`);
});
let failed = false;
try {
  await scenarios[name](page);
  check(problems.length === 0, problems.join("; "));
  console.log(`ok ${name}`);
} catch (error) {
  failed = true;
  console.error(`FAILED ${name} at step "${step}": ${error.stack ?? error}`);
  await shot(page, `failed-${name}`).catch(() => {});
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
