"""Tools from Model Context Protocol servers: `Relay(mcp=[MCPServer(...)])`.

config     MCPServer and RELAY_MCP's file
mapping    a listing's tools as Relay tools: names, arguments, risk (annotations only
           from a trusted server), idempotency
results    what a call returned, as the output the model reads
sessions   this process's connections to the servers, on its event loop
stderr     what a stdio server writes to its stderr: logged, kept to say why it failed
toolset    the app's servers: their listings kept in Redis, and a call of one tool
"""
