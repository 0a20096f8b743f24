// Browser tests of the console at /ui, in a real headless Chromium: Debian's
// (/usr/bin/chromium, or $CHROMIUM), driven by Playwright's library. No
// browser is downloaded. tests/tests/console.rs starts the emulator and the
// server, then runs one scenario at a time:
//
//   node console.mjs <scenario> <server url> <screenshot dir> [args...]
//
// Each scenario logs in through the Entra emulator's account picker, does
// what it says, prints `ok: ...` lines and a last `result: {json}` line, and
// exits 0; anything unexpected prints `FAIL: ...` and exits 1. With
// CONSOLE_STORAGE=<file>, a scenario starts with the cookies saved there
// (the replicas' scenarios save them).

import { chromium } from 'playwright-core';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const [scenario, server, shots, ...args] = process.argv.slice(2);
if (!scenario || !server || !shots) {
  console.log('FAIL: usage: node console.mjs <scenario> <server url> <screenshot dir> [args...]');
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
if (!existsSync(executablePath)) {
  console.log(`FAIL: no Chromium at ${executablePath}: apt-get install -y chromium chromium-driver (or set CHROMIUM)`);
  process.exit(1);
}
mkdirSync(shots, { recursive: true });

function check(condition, what) {
  if (!condition) throw new Error(what);
  console.log(`ok: ${what}`);
}

async function shot(page, name) {
  await page.screenshot({ path: join(shots, `${name}.png`), fullPage: false });
}

// The console's pages must not need anything the CSP forbids.
function watchViolations(page, violations) {
  page.on('console', (message) => {
    if (message.type() === 'error' && /Content Security Policy|Refused to/i.test(message.text())) {
      violations.push(message.text());
    }
  });
}

// Sign in as `user` (the emulator's picker lists "Name (username)").
// `member`: false for someone who is neither auditor nor admin, whom the
// callback answers itself (no session, the membership page).
async function login(page, user, member = true) {
  await page.goto(`${server}/ui`);
  await page.getByRole('link', { name: 'Sign in with your company account' }).click();
  await page.getByRole('link', { name: new RegExp(`\\(${user.replace(/[.]/g, '\\.')}\\)`) }).click();
  if (member) {
    await page.waitForURL((url) => url.pathname.startsWith('/ui') && !url.pathname.startsWith('/ui/callback'));
    // Back from the identity provider, a navigation another site started:
    // the console asks before it shows (and records) the view.
    const open = page.getByRole('link', { name: 'Open this view' });
    check((await open.count()) === 1, 'back from the login, the view waits to be opened');
    await open.click();
    await page.waitForLoadState();
  } else {
    await page.waitForURL((url) => url.pathname.startsWith('/ui/callback'));
    await page.waitForLoadState();
  }
}

// A request made from Node, not by the page: it says what the page's own
// link would (the console does nothing for another site's).
const sameOrigin = { headers: { 'sec-fetch-site': 'same-origin' } };

const scenarios = {
  // An auditor filters to one person's os:admin certificates, opens one,
  // sees its place in the chain; then the other views.
  async auditor(page, [person, role]) {
    await login(page, 'sam@example.com');
    const first = await page.request.get(`${server}/ui`);
    const csp = first.headers()['content-security-policy'] || '';
    check(csp.includes("default-src 'none'") && csp.includes("frame-ancestors 'none'"), 'a strict Content-Security-Policy');
    check(first.headers()['cache-control'] === 'no-store', 'Cache-Control: no-store');
    check(first.headers()['referrer-policy'] === 'no-referrer', 'Referrer-Policy: no-referrer');
    check(first.headers()['x-content-type-options'] === 'nosniff', 'X-Content-Type-Options: nosniff');
    const cookies = await page.context().cookies();
    const session = cookies.find((c) => c.name === '__Host-talos-sso-console');
    check(session && session.httpOnly && session.secure && session.sameSite === 'Lax', 'the session cookie is __Host-, Secure, HttpOnly, SameSite=Lax');

    await page.getByLabel('User').fill(person);
    await page.getByLabel('Role (requested or granted)').fill(role);
    await page.getByLabel('Event').selectOption('certificate.issued');
    await page.getByRole('button', { name: 'Filter' }).click();
    await page.waitForURL((url) => url.searchParams.get('username') === person);
    const rows = page.locator('table.records tbody tr');
    const count = await rows.count();
    check(count > 0, `the filter shows ${person}'s certificates (${count})`);
    for (let i = 0; i < count; i++) {
      const cells = rows.nth(i).locator('td');
      const user = (await cells.nth(4).innerText()).trim();
      const roles = await cells.nth(6).innerText();
      if (user !== person || !roles.includes(role)) throw new Error(`row ${i} is ${user} with ${roles}`);
    }
    check(true, `every row is ${person} with ${role}`);
    // The same view again: no second record of it.
    await page.reload();
    await shot(page, 'trail');

    const link = rows.first().locator('td').first().locator('a');
    const seq = (await link.innerText()).trim();
    await link.click();
    await page.waitForURL(`**/ui/records/${seq}`);
    const position = (await page.locator('dd.position').innerText()).trim();
    check(new RegExp(`^record ${seq} of \\d+$`).test(position), `record ${seq} shows its chain position: ${position}`);
    const hash = (await page.locator('dd.hash').innerText()).trim();
    check(/^[0-9a-f]{64}$/.test(hash), 'the record shows its hash');
    check((await page.getByText('matches: this record is as it was written').count()) === 1, 'its hash recomputes');
    const fingerprint = page.locator('dt', { hasText: 'Certificate fingerprint (SHA-256)' }).locator('xpath=following-sibling::dd[1]');
    check(/^[0-9a-f]{64}$/.test((await fingerprint.innerText()).trim()), 'the record shows the certificate fingerprint');
    await shot(page, 'record');

    await page.goto(`${server}/ui/held`);
    await page.getByLabel('Role').fill(role);
    await page.getByLabel('Cluster').fill('prod');
    await page.getByLabel('From').fill('1h');
    await page.getByRole('button', { name: 'Who held it' }).click();
    const held = await page.locator('table.held > tbody > tr').count();
    const heldText = await page.locator('table.held').innerText();
    check(held >= 1 && heldText.includes(person), `who held ${role} on prod: ${held} people, ${person} among them`);
    await shot(page, 'held');

    await page.goto(`${server}/ui/person?username=${encodeURIComponent(person)}`);
    check((await page.locator('h1').innerText()).includes(person), 'the person page');
    await shot(page, 'person');

    await page.goto(`${server}/ui/chain`);
    check((await page.getByText('The chain verifies.').count()) === 1, 'the chain verifies');
    await shot(page, 'chain');

    await page.goto(`${server}/ui/charts?since=1d&by=hour`);
    const bars = await page.locator('.chart svg rect').count();
    check(bars > 0, `the charts draw ${bars} bars`);
    await shot(page, 'charts');

    const csv = await page.request.get(`${server}/ui/export?format=csv&username=${encodeURIComponent(person)}&role=${encodeURIComponent(role)}&event=certificate.issued`, sameOrigin);
    const lines = (await csv.text()).trim().split('\n');
    check(csv.status() === 200 && lines[0].startsWith('seq,occurred_at,event') && lines.length === count + 1, `the CSV export holds the ${count} records`);
    const jsonl = await page.request.get(`${server}/ui/export?format=jsonl&username=${encodeURIComponent(person)}`, sameOrigin);
    const records = (await jsonl.text()).trim().split('\n').map((l) => JSON.parse(l));
    check(records.every((r) => r.username === person && /^[0-9a-f]{64}$/.test(r.hash)), 'the JSON lines export holds stored records');
    return { seq: Number(seq), rows: count, held };
  },

  // Not an auditor: the membership page.
  async nobody(page, [user]) {
    await login(page, user, false);
    const text = await page.locator('main').innerText();
    check((await page.locator('h1').innerText()) === 'No access', 'a non-auditor gets "No access"');
    check(/Ask for membership in/.test(text), `the page says whom to ask: ${text.split('\n')[1] || text}`);
    check((await page.locator('table.records').count()) === 0, 'and no records');
    await shot(page, 'refused');
    return { message: text };
  },

  // An admin adds a deny entry.
  async deny(page, [user, reason]) {
    await login(page, 'alice@example.com');
    await page.goto(`${server}/ui/deny`);
    await page.getByLabel('Username').fill(user);
    await page.getByLabel('Reason').fill(reason);
    await page.getByLabel('For', { exact: true }).fill('8h');
    await page.getByRole('button', { name: 'Add to the deny list' }).click();
    const done = await page.locator('p.ok').innerText();
    check(done.startsWith('Added:'), `the entry is added: ${done}`);
    const listed = await page.locator('table.deny tbody').innerText();
    check(listed.includes(reason), 'the list shows it');
    check(!listed.includes('removed by hand') && /\d{4}-\d{2}-\d{2}/.test(listed), `the list shows until when: ${listed}`);
    await shot(page, 'deny');
    return { added: done };
  },

  // Two replicas sharing one database: log in through this one, and the
  // other (`other`, another port of the same host: the cookie goes there
  // too) knows the session. The browser's cookies are kept in
  // $CONSOLE_STORAGE for `replicasLogout`.
  async replicasLogin(page, [other, user]) {
    await login(page, user);
    const who = async () => (await page.locator('span.who').count()) ? page.locator('span.who').innerText() : '';
    check((await who()) === user, `signed in through ${server}`);
    const session = (await page.context().cookies()).find((c) => c.name === '__Host-talos-sso-console');
    check(session && session.secure && session.httpOnly, 'the session cookie stays __Host-, Secure, HttpOnly');
    await page.goto(`${other}/ui`);
    check((await who()) === user, `the same session on the other replica ${other}`);
    check((await page.locator('table.records').count()) === 1, 'which shows the trail');
    await page.context().storageState({ path: process.env.CONSOLE_STORAGE });
    return { session: true };
  },

  // With the cookies of `replicasLogin`: still signed in on `other` (after
  // its restart), signed out there, and then signed out here too.
  async replicasLogout(page, [other, user]) {
    await page.goto(`${other}/ui`);
    check((await page.locator('span.who').innerText()) === user, `still signed in on ${other}`);
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.waitForURL('**/ui/signed-out');
    check((await page.locator('h1').innerText()) === 'Signed out', `signed out on ${other}`);
    await page.goto(`${server}/ui`);
    check((await page.getByRole('link', { name: 'Sign in with your company account' }).count()) === 1, `and signed out on ${server}`);
    check((await page.locator('span.who').count()) === 0, 'nobody is signed in there');
    return { signedOut: true };
  },

  // A tampered trail: the loud warning.
  async tampered(page) {
    await login(page, 'sam@example.com');
    await page.goto(`${server}/ui/chain`);
    // The last verification (minutes old at most) answers until asked again.
    await page.getByRole('button', { name: 'Verify again' }).click();
    await page.waitForLoadState();
    const alarm = page.locator('.alarm');
    check(await alarm.isVisible(), 'the warning banner shows');
    check((await alarm.innerText()).includes('The audit trail does not verify.'), 'it says the trail does not verify');
    check((await page.getByText('VERIFICATION FAILED.').count()) === 1, 'the chain page says VERIFICATION FAILED');
    await page.goto(`${server}/ui`);
    check(await page.locator('.alarm').isVisible(), 'the warning stays on the other pages');
    await page.goto(`${server}/ui/chain`);
    await shot(page, 'tampered');
    return { alarm: await alarm.innerText() };
  },
};

const run = scenarios[scenario];
if (!run) {
  console.log(`FAIL: unknown scenario ${scenario}`);
  process.exit(2);
}
const browser = await chromium.launch({ executablePath, headless: true, args: ['--no-sandbox'] });
let code = 0;
let page;
try {
  // $CONSOLE_STORAGE: the cookies of an earlier scenario, when it saved them.
  const storage = process.env.CONSOLE_STORAGE;
  const saved = storage && existsSync(storage) ? { storageState: storage } : {};
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 }, ...saved });
  page = await context.newPage();
  const violations = [];
  watchViolations(page, violations);
  const result = await run(page, args);
  if (violations.length) throw new Error(`the page broke its CSP: ${violations.join('; ')}`);
  console.log(`result: ${JSON.stringify(result)}`);
} catch (error) {
  console.log(`FAIL: ${error.message.split('\n')[0]}`);
  if (page) {
    // Where it stopped, for whoever reads the failure.
    console.log(`at: ${page.url()}`);
    console.log(`page: ${(await page.locator('body').innerText().catch(() => '')).slice(0, 2000)}`);
    await page.screenshot({ path: join(shots, `failed-${scenario}.png`) }).catch(() => {});
  }
  code = 1;
} finally {
  await browser.close();
}
process.exit(code);
