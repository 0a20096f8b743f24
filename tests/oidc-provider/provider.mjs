// A real, OpenID-certified OpenID Provider (panva's oidc-provider) set up
// the way Keycloak and Dex deployments usually are, for talos-sso's
// end-to-end tests (tests/src/real_op/mod.rs starts it; nothing else does).
// oidc-provider 8 is pinned: it supports Node.js 18 and later, where 9
// wants Node.js 22 (and warns on 20, the machines' version).
//
// - A `groups` scope releasing a `groups` claim, in the ID token as well
//   (`conformIdTokenClaims: false`: Keycloak's "Add to ID token", Dex's
//   default), next to `profile` (`preferred_username`) and `email`.
// - Opaque access tokens (oidc-provider's default, as Dex's and Okta's
//   org authorization server's), ID tokens without `jti`.
// - One public client for the CLI: PKCE required, a native app whose
//   loopback redirect `http://localhost/callback` admits any port (RFC
//   8252), refresh tokens for `offline_access` (rotated at each use, as
//   oidc-provider does for public clients), the device flow.
// - One confidential client for a SIEM's collector: the client credentials
//   grant, for the resource `urn:talos-sso` (RFC 8707), whose access
//   tokens are JWTs as RFC 9068 writes them (`aud: talos-sso`, `client_id`,
//   `sub` the client). The CLI asks for no resource, so its tokens stay as
//   they were.
// - With `--console-redirect URL`, one confidential web client for the
//   server's console (`talos-sso-console`): the authorization code flow
//   only, PKCE required as for the CLI, its secret sent in the form body
//   (`client_secret_post`, what the server sends), its one redirect URI
//   the console's callback on the server under test (its port is chosen
//   per test, hence the argument).
// - Sign-in without a person: the interaction route signs in the account
//   named by the `x-test-login` request header (the tests' browser sends it)
//   and grants every scope and claim asked for. A request without it gets a
//   403, so a login that should have been silent cannot pass unnoticed.
//
// Usage: node provider.mjs [--device-interval SECONDS] [--strict-offline-access]
//                          [--console-redirect URL]
// It listens on 127.0.0.1 on a free port, prints `issuer <URL>` on stdout
// once it serves, logs to stderr, and exits when its stdin closes (the test
// that started it ended, however it ended).

import { createServer } from 'node:http';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';

let Provider;
let errors;
try {
  ({ default: Provider, errors } = await import('oidc-provider'));
} catch (error) {
  console.error(
    `oidc-provider is not installed (${error.code || error.message}): run \`npm ci\` in ${fileURLToPath(new URL('.', import.meta.url))}`,
  );
  process.exit(3);
}

const CLIENT_ID = 'talos-sso-cli';
const COLLECTOR_ID = 'siem-collector';
const COLLECTOR_SECRET = 'siem-collector-secret';
const API_RESOURCE = 'urn:talos-sso';
const CONSOLE_ID = 'talos-sso-console';
const CONSOLE_SECRET = 'talos-sso-console-secret';

// The people: one on call, one in no group, one auditor. Subjects are
// opaque ids, as Keycloak's (UUIDs) and Dex's are; usernames are names.
const ACCOUNTS = {
  '5b0e2c1e-8f3a-4d6b-9a51-0c7d2e4f1a01': {
    preferred_username: 'bob', name: 'Bob Oncall', email: 'bob@example.com', groups: ['oncall'],
  },
  '5b0e2c1e-8f3a-4d6b-9a51-0c7d2e4f1a02': {
    preferred_username: 'dave', name: 'Dave Nogroup', email: 'dave@example.com',
  },
  '5b0e2c1e-8f3a-4d6b-9a51-0c7d2e4f1a03': {
    preferred_username: 'sam', name: 'Sam Auditor', email: 'sam@example.com', groups: ['auditors'],
  },
};

function accountByUsername(username) {
  return Object.keys(ACCOUNTS).find((sub) => ACCOUNTS[sub].preferred_username === username);
}

const args = process.argv.slice(2);
const intervalAt = args.indexOf('--device-interval');
const deviceInterval = intervalAt === -1 ? 5 : Number(args[intervalAt + 1]);
// `--strict-offline-access`: oidc-provider's own rule for refresh tokens
// (below), as a provider deployed with its defaults has it.
const strictOfflineAccess = args.includes('--strict-offline-access');
// `--console-redirect URL`: the console's callback, `<public_url>/ui/callback`.
const consoleAt = args.indexOf('--console-redirect');
const consoleRedirect = consoleAt === -1 ? undefined : args[consoleAt + 1];

function signingKey() {
  const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  return {
    ...privateKey.export({ format: 'jwk' }), kid: randomBytes(8).toString('hex'), alg: 'RS256', use: 'sig',
  };
}

function configuration() {
  return {
    clients: [{
      client_id: CLIENT_ID,
      client_name: 'talos-sso CLI',
      application_type: 'native',
      token_endpoint_auth_method: 'none',
      redirect_uris: ['http://localhost/callback'],
      grant_types: ['authorization_code', 'refresh_token', 'urn:ietf:params:oauth:grant-type:device_code'],
      response_types: ['code'],
    }, {
      client_id: COLLECTOR_ID,
      client_secret: COLLECTOR_SECRET,
      client_name: 'SIEM collector',
      token_endpoint_auth_method: 'client_secret_post',
      redirect_uris: [],
      grant_types: ['client_credentials'],
      response_types: [],
    }, ...(consoleRedirect ? [{
      client_id: CONSOLE_ID,
      client_secret: CONSOLE_SECRET,
      client_name: 'talos-sso console',
      application_type: 'web',
      token_endpoint_auth_method: 'client_secret_post',
      redirect_uris: [consoleRedirect],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    }] : [])],
    jwks: { keys: [signingKey()] },
    cookies: { keys: [randomBytes(32).toString('hex')] },
    scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
    claims: {
      openid: ['sub'],
      profile: ['preferred_username', 'name'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    conformIdTokenClaims: false,
    pkce: { required: () => true },
    features: {
      devInteractions: { enabled: false },
      deviceFlow: { enabled: true },
      revocation: { enabled: true },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: (_ctx, client) => (client.clientId === COLLECTOR_ID ? API_RESOURCE : undefined),
        useGrantedResource: () => false,
        getResourceServerInfo(_ctx, resource) {
          if (resource !== API_RESOURCE) throw new errors.InvalidTarget();
          return {
            scope: 'audit', audience: 'talos-sso', accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
    // oidc-provider follows OIDC Core 1.0 section 11 to the letter: it drops
    // `offline_access` from an authorization request without
    // `prompt=consent`, which the CLI does not send (it would show Entra's
    // and Keycloak's consent page at every login). Like Keycloak, which
    // issues a refresh token with every code, refresh tokens go to every
    // client allowed the grant; Dex and Okta need `offline_access`, which
    // the server's `identity.scopes` asks for.
    async issueRefreshToken(_ctx, client, code) {
      return client.grantTypeAllowed('refresh_token')
        && (!strictOfflineAccess || code.scopes.has('offline_access'));
    },
    async findAccount(_ctx, sub) {
      const account = ACCOUNTS[sub];
      if (!account) return undefined;
      return {
        accountId: sub,
        async claims() {
          return { sub, ...account, email_verified: true };
        },
      };
    },
    interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
    ttl: {
      AccessToken: 3600, AuthorizationCode: 60, DeviceCode: 300, Grant: 86400, IdToken: 3600,
      Interaction: 600, RefreshToken: 86400, Session: 86400,
    },
  };
}

// The interaction a person would click through: sign in as the account
// the `x-test-login` header names, then grant what was asked.
async function interaction(provider, req, res) {
  const details = await provider.interactionDetails(req, res);
  const { prompt, params, session, grantId } = details;
  if (prompt.name === 'login') {
    const username = req.headers['x-test-login'];
    const accountId = username && accountByUsername(username);
    if (!accountId) {
      res.writeHead(403, { 'content-type': 'text/plain' });
      res.end(`no test login: the x-test-login header names no account (${username || 'none'})\n`);
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === 'consent') {
    const grant = grantId
      ? await provider.Grant.find(grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missing.missingResourceScopes || {})) {
      grant.addResourceScope(indicator, scopes.join(' '));
    }
    await provider.interactionFinished(
      req,
      res,
      { consent: { grantId: await grant.save() } },
      { mergeWithLastSubmission: true },
    );
    return;
  }
  res.writeHead(400, { 'content-type': 'text/plain' });
  res.end(`unexpected prompt ${prompt.name}\n`);
}

const server = createServer();
server.listen(0, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, configuration());
  // RFC 8628 lets the provider choose the polling interval (Keycloak's
  // "OAuth 2.0 Device Polling Interval"); oidc-provider names none, so
  // clients use 5 s. The tests ask for less.
  provider.use(async (ctx, next) => {
    await next();
    if (ctx.path === '/device/auth' && ctx.status === 200 && ctx.body?.device_code) {
      ctx.body = { ...ctx.body, interval: deviceInterval };
    }
  });
  provider.on('server_error', (_ctx, error) => console.error('server_error', error));
  const callback = provider.callback();
  server.on('request', (req, res) => {
    if (req.url.startsWith('/interaction/')) {
      interaction(provider, req, res).catch((error) => {
        console.error('interaction failed', error);
        if (!res.headersSent) res.writeHead(500);
        res.end();
      });
    } else {
      callback(req, res);
    }
  });
  process.stdout.write(`issuer ${issuer}\n`);
});

process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
