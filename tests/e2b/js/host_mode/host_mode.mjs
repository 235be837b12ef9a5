// Host mode on the pinned E2B JS SDK: no E2B_SANDBOX_URL, as against E2B itself, so the SDK
// reaches envd at https://49983-{id}.{domain} and ports at https://{port}-{id}.{domain}, on
// SPACE's TLS listener. Run by `js_sdk_host_mode` (crates/test-support/tests/e2b_sdk.rs),
// which passes E2B_API_KEY, E2B_API_URL (plaintext), E2B_DOMAIN (`space.test:{TLS port}`),
// NODE_EXTRA_CA_CERTS (its CA) and SPACE_E2B_TEMPLATE. Nothing resolves `*.space.test`: the
// file adds `/etc/hosts` lines for its sandbox (the suite runs as root) and removes them at
// the end. Not named `*.test.mjs`, so the main suite (`node --test tests/e2b/js`) skips it.

import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import fs from 'node:fs'
import { after, before, describe, test } from 'node:test'
import { Sandbox } from '#e2b'
import '../sdk.mjs'

const HOSTS = '/etc/hosts'
const ENVD_PORT = 49983
const PAGE = 'hello over TLS\n'

function required(name) {
  const value = process.env[name]
  if (!value) throw new Error(`${name} is not set: run the suite through the harness`)
  return value
}

describe('host mode over TLS', () => {
  const mark = `# space-e2b-host-mode ${randomUUID()}`
  let sbx

  before(async () => {
    assert.equal(process.env.E2B_SANDBOX_URL, undefined, 'host mode runs without E2B_SANDBOX_URL')
    sbx = await Sandbox.create(required('SPACE_E2B_TEMPLATE'), { timeoutMs: 600_000 })
    const domain = sbx.sandboxDomain.split(':')[0]
    const names = [ENVD_PORT, 8000].map((port) => `${port}-${sbx.sandboxId}.${domain}`)
    fs.appendFileSync(HOSTS, `127.0.0.1 ${names.join(' ')} ${mark}\n`)
  })

  after(async () => {
    // In place, not by rename: /etc/hosts may be a mount point.
    const kept = fs.readFileSync(HOSTS, 'utf8').split('\n').filter((l) => !l.includes(mark))
    fs.writeFileSync(HOSTS, kept.join('\n'))
    await sbx?.kill().catch(() => {})
  })

  test('the sandbox domain is the TLS listener\'s', () => {
    assert.equal(sbx.sandboxDomain, required('E2B_DOMAIN'))
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${required('E2B_DOMAIN')}`)
  })

  test('commands and files reach envd by name over https', async () => {
    assert.equal((await sbx.commands.run('echo hi; id -un')).stdout, 'hi\nuser\n')
    await sbx.files.write('/home/user/a.txt', 'over TLS')
    assert.equal(await sbx.files.read('/home/user/a.txt'), 'over TLS')
    const handle = await sbx.commands.run('sleep 600', { background: true })
    assert.ok((await sbx.commands.list()).some((p) => p.pid === handle.pid))
    assert.equal(await sbx.commands.kill(handle.pid), true)
  })

  test('getHost reaches a server in the sandbox over https', async () => {
    await sbx.files.write('/home/user/www/index.html', PAGE)
    const server = await sbx.commands.run('busybox httpd -f -p 8000 -h /home/user/www', { background: true, timeoutMs: 0 })
    const url = `https://${sbx.getHost(8000)}/index.html`
    const deadline = Date.now() + 30_000
    let r
    for (;;) {
      r = await fetch(url, { headers: { 'e2b-traffic-access-token': sbx.trafficAccessToken } })
      if (r.status === 200 || Date.now() > deadline) break
      await new Promise((ok) => setTimeout(ok, 200))
    }
    assert.equal(r.status, 200)
    assert.equal(await r.text(), PAGE)
    await server.kill()
  })

  test('signed URLs work as given', async () => {
    await sbx.files.write('/home/user/signed.txt', 'signed content')
    const url = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 })
    assert.ok(url.startsWith(`https://${ENVD_PORT}-${sbx.sandboxId}.`), url)
    const r = await fetch(url)
    assert.equal(r.status, 200)
    assert.equal(await r.text(), 'signed content')
  })
})
